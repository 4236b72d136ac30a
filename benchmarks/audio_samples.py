"""The audio sweep's models and samples (``vision_language_families.py --audio``): which model types take audio
(:func:`audio_families`), a small model's audio fitted where the every-type shrinker leaves it unrunnable
(:func:`fitted_audio_model`), and one audio with its prompt (:func:`audio_sample`; see that module's docstring).

Not a test: the sweep imports it from ``benchmarks/`` (after ``tests_environment``).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
import transformers
from family_sweep import CannotRunEagerly, first_line
from model_sources import transformers_all_models as every

from pipeline.generation.vision_inputs import AUDIO, IMAGES


def audio_families() -> dict[str, str]:
    """model type -> its class, for the speech and sequence-to-sequence LMs whose config is not an encoder-decoder
    (audio-language decoders), and the generative types of the other mappings whose class takes audio
    (:func:`takes_audio`: Gemma 3n, Qwen Omni's thinkers, ...), from transformers' mappings."""
    import transformers
    from transformers.models.auto import modeling_auto as auto

    speech = {**auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, **auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES}
    mapping = transformers.CONFIG_MAPPING
    names = {k: n for k, n in speech.items() if k in mapping and not getattr(mapping[k](), "is_encoder_decoder", 0)}
    for generative in (auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, auto.MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES):
        names.update({k: n for k, n in generative.items() if k not in names and k in mapping and takes_audio(k, n)})
    return {kind: name if isinstance(name, str) else name[0] for kind, name in sorted(names.items())}


def takes_audio(kind: str, names: Any) -> bool:
    """Whether the model type's class (``names``: a mapping's) takes audio: ``get_audio_features`` on it or on its base
    model's class (its ``.model``), or a forward taking ``input_features`` or ``input_values``."""
    from transformers.models.auto import modeling_auto as auto

    base = auto.MODEL_MAPPING_NAMES.get(kind)
    classes = [getattr(transformers, n, None) for n in (names if isinstance(names, (list, tuple)) else [names])]
    owners = [*classes, getattr(transformers, base if isinstance(base, str) else "", None)]
    if any(hasattr(owner, AUDIO.method) for owner in owners if owner is not None):
        return True
    forwards = [inspect.signature(c.forward).parameters for c in classes if c is not None and hasattr(c, "forward")]
    return any(set(AUDIO.main_inputs) & set(parameters) for parameters in forwards)


def audio_sample(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One audio and its prompt (see the module docstring): 2 text tokens, an audio token per feature, 4 text."""
    from pipeline.generation.vision_graph import image_features, image_token_id
    from pipeline.generation.vision_inputs import check_features_alone, image_features_method, image_input_names

    name = type(model).__name__
    config: Any = model.config
    check_features_alone(model, AUDIO)  # a method that needs the prompt: the conversion's refusal is the row
    if image_features_method(model, AUDIO) is None:  # the conversion finds them in the forward, or refuses
        return forward_audio_sample(model)
    if image_token_id(model, AUDIO) is None:
        config.audio_token_id = free_audio_token(model)
    token = image_token_id(model, AUDIO)
    assert token is not None
    masks = [n for n in image_input_names(model, AUDIO) if n not in AUDIO.main_inputs and n.endswith("mask")]
    text = torch.randint(3, min(100, token), (1, 6), generator=torch.Generator().manual_seed(1))
    failures = []
    for features in audio_layouts(model, config):
        main = AUDIO.main_input(image_input_names(model, AUDIO))
        # the masks over the frames: the last axis ([batch, mels, frames]), else the second ([batch, frames, width]);
        # as integers, then as booleans (Gemma 4 selects by its mask): the first the method and the forward run on
        for kind, frames in [(k, f) for k in KINDS for f in dict.fromkeys((features.shape[-1], features.shape[1]))]:
            audio = {main: features, **{n: torch.ones(1, frames, dtype=kind) for n in masks}}
            try:
                with torch.no_grad():
                    count = int(image_features(model, audio).shape[0])
                    ids = torch.cat([text[:, :2], torch.full((1, count), token), text[:, 2:]], dim=1)
                    sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **audio}
                    model(**sample)
                return sample
            except Exception as error:  # noqa: BLE001 - the next layout
                failure = f"{list(features.shape)}: {type(error).__name__}: {first_line(error)[:100]}"
        failures.append(failure)
    raise CannotRunEagerly(f"{name}.get_audio_features runs on no input_features layout: {'; '.join(failures)}")


def free_audio_token(model: torch.nn.Module) -> int:
    """The vocabulary's last id that is not the model's image or video token: the audio token of a config naming none
    (Voxtral's default), as a checkpoint's config names one."""
    from pipeline.generation.vision_graph import image_token_id

    taken = {image_token_id(model, IMAGES), getattr(model.config, "video_token_id", None)}
    return max(set(range(int(model.config.get_text_config().vocab_size))) - taken)


#: The dtypes of the audio masks, tried in turn.
KINDS = (torch.long, torch.bool)
#: A forward's count check of its audio tokens against its audio's features (Qwen2-Audio's).
COUNTS = re.compile(r"tokens: (\d+), features: (\d+)")


def forward_audio_sample(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One audio and its prompt for a model without ``get_audio_features`` (its forward computes the features):
    the first layout its forward runs on, with a mask of every frame for each of its forward's audio masks and as many
    audio tokens as its count check says the audio gives (2 text tokens, the audio tokens, 4 text)."""
    from pipeline.generation.vision_graph import image_token_id

    token = image_token_id(model, AUDIO)
    if token is None:
        raise CannotRunEagerly(f"{type(model).__name__} has no get_audio_features and its config names no audio token")
    parameters = inspect.signature(model.forward).parameters
    masks = [n for n in parameters if n.endswith("mask") and n != "attention_mask" and ("feature" in n or "audio" in n)]
    main = AUDIO.main_input(parameters)
    text = torch.randint(3, min(100, token), (1, 6), generator=torch.Generator().manual_seed(1))
    failures = []
    for features in audio_layouts(model, model.config):
        audio = {main: features, **{n: torch.ones(1, features.shape[-1], dtype=torch.long) for n in masks}}
        count = 2  # consecutive audio tokens (a single one may be expanded by the model itself)
        for _ in range(2):
            ids = torch.cat([text[:, :2], torch.full((1, count), token), text[:, 2:]], dim=1)
            sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **audio}
            try:
                with torch.no_grad():
                    model(**sample)
                return sample
            except Exception as error:  # noqa: BLE001 - recounted once, else the next layout
                found = COUNTS.search(str(error))
                failure = f"{list(features.shape)}: {type(error).__name__}: {first_line(error)[:100]}"
                if found is None:
                    break
                count = int(found[2])
        failures.append(failure)
    raise CannotRunEagerly(f"{type(model).__name__}'s forward runs on no audio layout: {'; '.join(failures)}")


def fit_gemma3n(config: Any) -> None:
    """Gemma 3n's token ranges fitted to the shrunk text vocabulary (384): its vision tokens from 128, its audio tokens
    from 256 (a checkpoint's lie past its 262144 text tokens, past the shrunk vocabulary, so the small config's forward
    embeds no audio token), its image and audio placeholders in them, and as many audio tokens per audio as its tower
    gives the sweep's audio ([1, 32, input_feat_size]: 2; its forward pads the features to that count)."""
    config.text_config.vocab_size = 384
    config.vision_config.vocab_offset, config.audio_config.vocab_offset = 128, 256
    config.image_token_id, config.audio_token_id, config.audio_soft_tokens_per_image = 129, 257, 2


#: Widths the every-type shrinker leaves at a checkpoint's size where an audio model's projection meets them: the
#: Q-Former projector's input (Granite Speech's) to the encoder's width; Nemotron-H Omni's projector; Gemma 3n's token
#: ranges (:func:`fit_gemma3n`). (An audio tower's ``output_dim``, Qwen3-ASR's and Qwen Omni's, is fitted to the text
#: width for every type: :func:`fitted_audio_model`.)
AUDIO_FITS: dict[str, Any] = {
    "granite_speech": lambda c: setattr(c.projector_config, "encoder_hidden_size", c.encoder_config.hidden_dim),
    "granite_speech_plus": lambda c: setattr(c.projector_config, "encoder_hidden_size", c.encoder_config.hidden_dim),
    # the projector's width and bias a checkpoint's audio config holds (the small Parakeet config has neither)
    "nemotron_h_omni": lambda c: c.audio_config.__dict__.update(projection_hidden_size=64, projection_bias=False),
    "gemma3n": fit_gemma3n,
}


def fitted_audio_model(kind: str, model: torch.nn.Module) -> torch.nn.Module:
    """``model`` built again from its config with :data:`AUDIO_FITS`' widths and its audio tower's ``output_dim`` the
    text width (its generation config kept); as it is when nothing is fitted."""
    config: Any = model.config
    spec = (getattr(type(config), "sub_configs_defaults", None) or {}).get("audio_config")
    absent = spec is not None and getattr(config, "audio_config", 0) is None
    if absent:  # an optional audio branch the small config leaves off (Nemotron-H Omni's): its type's small config
        from model_sources.transformers_all_shrink import shrunk

        config.audio_config = shrunk(spec.model_type)
        for name, value in (getattr(spec, "init_kwargs", None) or {}).items():
            setattr(config.audio_config, name, value)
        if getattr(config, "audio_token_id", 0) is None:  # read when the model is built
            config.audio_token_id = free_audio_token(model)
    audio, width = getattr(config, "audio_config", None), config.get_text_config().hidden_size
    projected = isinstance(getattr(audio, "output_dim", None), int) and audio.output_dim != width
    if kind not in AUDIO_FITS and not projected and not absent:
        return model
    AUDIO_FITS.get(kind, lambda c: None)(config)
    if projected:
        audio.output_dim = width
    rebuilt = type(model)(config).eval()
    rebuilt.generation_config = model.generation_config
    return rebuilt


def audio_layouts(model: torch.nn.Module, config: Any) -> list[torch.Tensor]:
    """The every-type source's audio inputs (mel features, a waveform), then mel features of 100 and 200 frames (an
    encoder that cuts its frames into windows: Qwen3-ASR's 100), frames stacked to the width the audio config takes,
    and waveforms of one channel."""
    found = [c[n] for c in every.candidate_samples(model, config) for n in AUDIO.main_inputs if n in c]
    mels = next((int(f.shape[1]) for f in found if f.dim() == 3), 16)
    generator = torch.Generator().manual_seed(0)
    extra = [torch.randn(1, mels, frames, generator=generator) for frames in (100, 200)]
    # frames stacked as the audio config says it takes them (FunASR-Nano's ``input_size``: 7 mel frames a row)
    audio = getattr(config, "audio_config", None)
    width = getattr(audio, "input_size", None)
    stacked = [torch.randn(1, 32, width, generator=generator)] if isinstance(width, int) and width != mels else []
    # waveforms of one channel: 0.1 s, and 1 s at 16 kHz (a tokenizer that strides 3200 samples: VibeVoice's)
    waves = [torch.randn(1, 1, samples, generator=generator) for samples in (1600, 16000)]
    # then, drawn apart (the layouts above as they were): [frames, width] of the audio config's other widths (Gemma
    # 3n's ``input_feat_size``, Gemma 4 Unified's samples a token) and of 128 mels (Gemma 4's), and 0.12 s as [batch,
    # samples] (a tower whose patches take a multiple of 96 samples: Muse Spark's)
    generator = torch.Generator().manual_seed(1)
    names = ("input_feat_size", "num_mel_bins", "audio_embed_dim")
    widths = [w for w in dict.fromkeys([*(getattr(audio, n, None) for n in names), 128]) if isinstance(w, int)]
    more = [torch.randn(1, 32, w, generator=generator) for w in widths if w not in (width, mels)]
    return [*found, *extra, *stacked, *waves, *more, torch.randn(1, 1920, generator=generator)]
