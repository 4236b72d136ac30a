"""Audio through an image-text model that also takes audio: a tiny Qwen2.5-Omni thinker (random weights, nothing
downloaded) converted from an audio sample decodes a left-padded batch of two prompts, another audio each, as its
``model.generate`` does (greedy tokens, every step's scores within 1e-3, 4 beams); another audio decodes otherwise in
both alike. Its ``get_audio_features`` selects the frames by ``feature_attention_mask`` (boolean indexing, a size from
the data): the features graph holds the mask at the sample's audio (every frame), as a vision tower's grid is held,
and an audio whose mask drops frames is refused at generate; so is a tiny Qwen3-ASR's, whose tower reads its chunks'
lengths as Python numbers (the audio-language sweep's row, lost when that export error got a message of its own). A
mask made under ``torch.vmap`` (Gemma 4's audio tower, converted for TensorRT) is passed by when the conversion looks
for selections that keep every element.

Mixed modalities are refused with a clear error: a sample holding both ``pixel_values`` and ``input_features`` (one
conversion places one modality's features), and ``generate`` of the audio module handed ``pixel_values``."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import decodes_as_transformers, decodes_its_audio_as_transformers, drawn_by_fan_in, qwen_omni_thinker

import pipeline
from converters.errors import InputError
from pipeline.runtime.executors import EngineNotRunnableWarning
from pipeline.runtime.generation.vision_language import VisionLanguageModule

RTX = importlib.util.find_spec("tensorrt_rtx") is not None

GENERATION = {"max_length": 40, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 6}
AUDIO_TOKEN, IMAGE_TOKEN, AUDIO_START, AUDIO_END = 125, 127, 123, 124
MELS, FRAMES = 16, 32
#: An image of 4 x 4 patches of 8 pixels (2 frames each), as Qwen2.5-Omni's processor gives it.
IMAGE = {"pixel_values": torch.randn(16, 384, generator=torch.Generator().manual_seed(4))}
IMAGE["image_grid_thw"] = torch.tensor([[1, 4, 4]])


@pytest.fixture(scope="module")
def model_and_inputs() -> tuple[Any, dict[str, torch.Tensor]]:
    """The thinker and a batch of two prompts, each an audio between its start and end tokens after 2 text tokens, the
    second left-padded by 2; their audios (every frame kept)."""
    model = qwen_omni_thinker(MELS, FRAMES)
    features = torch.randn(2, MELS, FRAMES, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, FRAMES, dtype=torch.long)
    with torch.no_grad():
        count = int(model.get_audio_features(features[:1], mask[:1]).last_hidden_state.shape[0])
    text = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    audio = torch.tensor([[AUDIO_START, *[AUDIO_TOKEN] * count, AUDIO_END]] * 2)
    ids = torch.cat([text[:, :2], audio, text[:, 2:]], dim=1)
    ids[1, 2:] = ids[1, :-2].clone()  # the second prompt left-padded by 2
    ids[1, :2] = 0
    attention = torch.ones_like(ids)
    attention[1, :2] = 0
    return model, {
        "input_ids": ids,
        "attention_mask": attention,
        "input_features": features,
        "feature_attention_mask": mask,
    }


@pytest.fixture(scope="module")
def module(model_and_inputs: tuple[Any, dict[str, torch.Tensor]]) -> VisionLanguageModule:
    converted = pipeline.convert(*model_and_inputs, generation=GENERATION, validate=False)
    assert isinstance(converted, VisionLanguageModule)
    return converted


def test_omni_thinker_audio_decodes_as_transformers(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule
) -> None:
    """Greedy tokens, every step's scores within 1e-3 and 4 beams as transformers'; another audio decodes otherwise."""
    model, inputs = model_and_inputs
    assert module.modality == "audio"
    decodes_its_audio_as_transformers(model, module, inputs, **GREEDY)


@pytest.mark.skipif(not RTX, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_builds_the_audio_graph_and_the_step(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]],
) -> None:
    """The real builder builds the audio features graph (its frame mask held) and the M-RoPE text step."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineNotRunnableWarning)
        built = pipeline.convert(
            *model_and_inputs, generation=GENERATION, validate=False, backend="tensorrt-rtx", trt_engine_cache=False
        )
    assert isinstance(built, VisionLanguageModule) and built.modality == "audio"
    assert built.vision.engine_bytes and built.step.engine_bytes


def test_a_sample_of_images_and_audio_is_refused(model_and_inputs: tuple[Any, dict[str, torch.Tensor]]) -> None:
    """A sample with an image and an audio is refused at conversion, naming both and the fix (one conversion per
    modality), rather than taken as images with its audio left unplaced."""
    model, inputs = model_and_inputs
    with pytest.raises(InputError) as refused:
        pipeline.convert(model, {**inputs, **IMAGE}, generation=GENERATION, validate=False)
    said = str(refused.value)
    assert "pixel_values" in said and "input_features" in said and "once per modality" in said


def test_the_audio_module_refuses_an_image(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule
) -> None:
    """The audio module's generate refuses an image rather than leaving it unplaced."""
    with pytest.raises(InputError, match="another modality's input"):
        module.generate(**model_and_inputs[1], pixel_values=IMAGE["pixel_values"], **GREEDY)


def test_an_audio_of_other_frames_is_refused(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule
) -> None:
    """The features graph holds the sample's frame mask (every frame): an audio whose mask drops frames is refused,
    the masks shown by shape and count (not hundreds of values)."""
    inputs = dict(model_and_inputs[1])
    mask = inputs["feature_attention_mask"].clone()
    mask[0, -8:] = 0
    frames = mask.shape[-1]
    shown = rf"is <\[1, {frames}\]: {frames - 8} of {frames} nonzero>, but the features graph was converted for <"
    with pytest.raises(InputError, match=shown) as refused:
        module.generate(**{**inputs, "feature_attention_mask": mask}, **GREEDY)
    assert len(str(refused.value)) < 600


def test_masks_made_under_vmap_are_not_read() -> None:
    """A boolean mask made under ``torch.vmap`` (transformers' mask functions, Gemma 4's audio tower for TensorRT)
    holds one element's values, which cannot be read: the search for selections that keep every element passes it by
    and still finds the selections by whole masks (the mask made after it, of its result, among them)."""
    from pipeline.generation.kept_selections import kept_selections

    def features() -> torch.Tensor:
        frames = torch.randn(4, 3)
        within = torch.vmap(lambda row: row.abs() >= 0)(frames)  # every frame, decided per row
        return frames[frames.abs().sum(-1) >= 0][within.all(-1)]

    kept = kept_selections(features)
    assert [selection.shape for selection in kept] == [(4,), (4,)]


def test_an_audio_tower_reading_its_lengths_as_numbers_holds_its_mask() -> None:
    """Qwen3-ASR's audio tower reads its chunks' lengths (from ``input_features_mask``) as Python numbers, which a
    trace has not: the features graph holds the mask at the sample's audio, and decodes as transformers does."""
    audio = {"num_mel_bins": MELS, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64}
    audio |= {"d_model": 32, "n_window": 50, "output_dim": 32, "downsample_hidden_size": 32}
    text = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "head_dim": 16}
    text |= {"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64}
    config = transformers.Qwen3ASRConfig(audio_config=audio, text_config=text, audio_token_id=AUDIO_TOKEN)
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.Qwen3ASRForConditionalGeneration(config))
    features = torch.randn(2, MELS, 100, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 100, dtype=torch.long)
    with torch.no_grad():
        count = int(model.get_audio_features(features[:1], mask[:1]).pooler_output.shape[0])
    ids = torch.randint(3, 100, (2, 6 + count), generator=torch.Generator().manual_seed(1))
    ids[:, 2 : 2 + count] = AUDIO_TOKEN
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    inputs |= {"input_features": features, "input_features_mask": mask}
    module = pipeline.convert(model, inputs, generation=GENERATION, validate=False)
    decodes_as_transformers(model, module, inputs, **GREEDY)


def test_an_audio_of_a_whole_number_of_chunks_converts() -> None:
    """Qwen3-Omni's thinker selects its audio's frames by ``feature_attention_mask`` (held at the sample's audio);
    an audio of exactly its chunk's frames (100: 1 s of a real checkpoint's 100 frames per second) made the boolean
    selection's size one the export could neither leave to the data nor pin (PendingUnbackedSymbolNotFound). A mask
    computed from held inputs alone now selects by constant indices: it converts and decodes as transformers does, and
    the real TensorRT-RTX builder builds that audio graph (no NonZero left) and the step."""
    audio = {"num_mel_bins": MELS, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64}
    audio |= {"d_model": 32, "max_source_positions": 100, "output_dim": 32, "n_window": 50, "n_window_infer": 100}
    audio |= {"downsample_hidden_size": 8}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 8}
    vision |= {"out_hidden_size": 32, "deepstack_visual_indexes": [0], "num_position_embeddings": 64}
    text = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "head_dim": 16}
    text |= {"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128}
    text |= {"moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2}
    text |= {"rope_parameters": {"rope_theta": 1e6, "rope_type": "default", "mrope_section": [2, 3, 3]}}
    config = transformers.Qwen3OmniMoeThinkerConfig(
        audio_config=audio,
        vision_config=vision,
        text_config=text,
        audio_token_id=AUDIO_TOKEN,
        image_token_id=IMAGE_TOKEN,
        video_token_id=126,
        audio_start_token_id=AUDIO_START,
        vision_start_token_id=121,
        user_token_id=122,
    )
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.Qwen3OmniMoeThinkerForConditionalGeneration(config))
    features = torch.randn(2, MELS, 100, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 100, dtype=torch.int32)
    with torch.no_grad():
        count = int(model.get_audio_features(features[:1], mask[:1]).last_hidden_state.shape[0])
    text_ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([text_ids[:, :2], torch.tensor([[AUDIO_START, *[AUDIO_TOKEN] * count, AUDIO_END]] * 2)], dim=1)
    ids = torch.cat([ids, text_ids[:, 2:]], dim=1)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    inputs |= {"input_features": features, "feature_attention_mask": mask}
    module = pipeline.convert(model, inputs, generation={"max_length": 80, "max_batch": 8}, validate=False)
    assert isinstance(module, VisionLanguageModule) and module.modality == "audio"
    decodes_as_transformers(model, module, inputs, **GREEDY)
    assert "NonZero" not in {node.op_type for node in module.vision.onnx.graph.node}
    if RTX:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EngineNotRunnableWarning)
            built = pipeline.convert(
                model,
                inputs,
                generation={"max_length": 80, "max_batch": 8},
                validate=False,
                backend="tensorrt-rtx",
                trt_engine_cache=False,
            )
        assert built.vision.engine_bytes and built.step.engine_bytes
