"""``pipeline generate --audio FILE.wav --feature-extractor DIR``: audio files through a speech model's own feature
extractor, into the inputs its encoder takes; ``pipeline generate DIR --processor P --audio FILE.wav --prompt TEXT``:
an audio-language decoder's prompts (GLM-ASR's, Audio Flamingo 3's, Qwen3-ASR's, Qwen Omni's thinkers': text with the
processor's audio placeholder, one audio each) through its own processor (:func:`audio_prompts`), which writes the
audio's tokens where each prompt holds the placeholder and makes the audio features the model takes. The placeholder
is written as the processor's chat template writes an audio item (Qwen Omni's ``<|audio_bos|><|AUDIO|><|audio_eos|>``:
:func:`audio_placeholder`); an audio the processor cuts to its window is named in a warning; an artifact whose audio
graph holds its sample's frame mask (Qwen Omni's) refuses audio of another length in seconds
(:func:`check_audio_frames`). A processor whose call takes no audio (Voxtral's: audio only through its chat template,
``mistral-common``'s tokenizer) is given each prompt as a user turn of its audio file and its text
(:func:`chat_prompts`).

WAV files are read with the standard library's ``wave`` (PCM, 8, 16, 24 or 32 bits, any channel count: averaged to
mono). The feature extractor is the model's, from a local directory (``AutoFeatureExtractor.from_pretrained``,
offline), so the features are those the model was trained on; the audio's sample rate must be the extractor's (no
resampling here: ``ffmpeg -i in.mp3 -ac 1 -ar 16000 out.wav`` makes such a file).
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import torch

#: The PCM sample widths read, in bytes.
_WIDTHS = (1, 2, 3, 4)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """The file's samples as float32 mono in [-1, 1], and its sample rate."""
    import numpy as np

    if not path.is_file():
        raise InputError(f"--audio {path}: no such file", fix="give a .wav file")
    try:
        with wave.open(str(path), "rb") as reader:
            channels, width, rate = reader.getnchannels(), reader.getsampwidth(), reader.getframerate()
            frames = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise InputError(
            f"--audio {path} is not a PCM WAV file: {exc}",
            fix="convert it to 16-bit PCM WAV, e.g. ffmpeg -i IN -ac 1 -ar 16000 -sample_fmt s16 OUT.wav",
        ) from exc
    if width not in _WIDTHS or not frames:
        raise InputError(
            f"--audio {path}: {'no samples' if not frames else f'{8 * width}-bit samples'}",
            fix="give a PCM WAV file of 8, 16, 24 or 32-bit samples",
        )
    if width == 3:  # little-endian 24-bit: sign-extended into the top of an int32
        raw = np.frombuffer(frames, np.uint8).reshape(-1, 3)
        padded = np.zeros((raw.shape[0], 4), np.uint8)
        padded[:, 1:] = raw
        samples = padded.view("<i4").ravel().astype(np.float32) / 2.0**31
    elif width == 1:  # unsigned 8-bit, centred on 128
        samples = (np.frombuffer(frames, np.uint8).astype(np.float32) - 128.0) / 128.0
    else:  # signed 16 or 32-bit, little-endian
        samples = np.frombuffer(frames, f"<i{width}").astype(np.float32) / 2.0 ** (8 * width - 1)
    return samples.reshape(-1, channels).mean(axis=1), rate


def load_feature_extractor(directory: Path) -> Any:
    """The model's feature extractor from a local directory (offline)."""
    from transformers import AutoFeatureExtractor

    try:
        return AutoFeatureExtractor.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"--feature-extractor {directory}: no feature extractor loads from it ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]})",
            fix="give the directory the model's processor or feature extractor was saved to (save_pretrained)",
        ) from exc


def read_clips(paths: list[Path], rate: int | None) -> list[np.ndarray]:
    """The audio files' samples (:func:`read_wav`), each sampled at ``rate`` (the feature extractor's) when one is
    given."""
    clips = []
    for path in paths:
        samples, found = read_wav(path)
        if rate is not None and found != rate:
            raise InputError(
                f"--audio {path} is sampled at {found} Hz; the feature extractor takes {rate} Hz",
                fix=f"resample it, e.g. ffmpeg -i {path.name} -ac 1 -ar {rate} out.wav",
            )
        clips.append(samples)
    return clips


def audio_inputs(paths: list[Path], directory: Path | None, takes: list[str]) -> dict[str, torch.Tensor]:
    """The encoder's inputs (those of ``takes`` the extractor makes) for the audio files, one row each."""
    import torch

    if directory is None:
        raise InputError("--audio needs the model's feature extractor", fix="pass --feature-extractor DIR")
    extractor = load_feature_extractor(directory)
    rate = getattr(extractor, "sampling_rate", None)
    clips = read_clips(paths, rate)
    try:  # the extractor's own padding first (Whisper's pads every clip to its 30 s window, which its model takes)
        made = extractor(clips, sampling_rate=rate, return_tensors="pt", return_attention_mask=True)
    except ValueError:  # clips of several lengths that the extractor does not pad by default: to the longest
        made = extractor(clips, sampling_rate=rate, return_tensors="pt", return_attention_mask=True, padding=True)
    inputs = {name: torch.as_tensor(made[name]) for name in takes if name in made}
    if not inputs:
        raise InputError(
            f"the feature extractor makes {', '.join(made)}; this model's encoder takes {', '.join(takes)}",
            fix="give the feature extractor of the model that was converted",
        )
    return inputs


def audio_prompts(processor: Any, prompts: list[str], paths: list[Path]) -> dict[str, torch.Tensor]:
    """An audio-language decoder's inputs for prompts (text with the processor's audio placeholder,
    ``processor.audio_token``, one audio each), left-padded as a decoder-only model's batch is: ``processor(text=...,
    audio=..., sampling_rate=...)`` at its feature extractor's rate, without the inputs the processor names unused
    (GLM-ASR's ``num_audio_tokens``). A processor whose call takes no audio (Voxtral's) takes them through its chat
    template instead (:func:`chat_prompts`)."""
    import torch

    if len(prompts) != len(paths):
        raise InputError(
            f"{len(prompts)} prompt(s) and {len(paths)} audio file(s): each prompt takes one audio",
            fix="give one --prompt per --audio, in the same order",
        )
    if not takes_audio(processor):
        return chat_prompts(processor, prompts, paths)
    token = getattr(processor, "audio_token", None)
    if isinstance(token, str) and token:
        check_placeholders(prompts, token, audio_placeholder(processor, token))
    extractor = getattr(processor, "feature_extractor", None)
    rate = getattr(extractor, "sampling_rate", None)
    if extractor is None or not isinstance(rate, int):
        raise InputError(
            f"--processor {type(processor).__name__} has no feature extractor with a sampling rate: it takes no audio",
            fix="give the directory the audio-language model's processor was saved to (processor.save_pretrained)",
        )
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is not None:
        tokenizer.padding_side = "left"
    clips = read_clips(paths, rate)
    try:
        made = processor(text=prompts, audio=clips, sampling_rate=rate, return_tensors="pt", padding=True)
    except (ValueError, TypeError) as exc:
        raise InputError(
            f"--processor {type(processor).__name__} refuses the prompts and audio: {' '.join(str(exc).split())[:300]}",
            fix="write each --prompt as the model's processor expects it (with its audio placeholder), one --audio "
            "each",
        ) from exc
    unused = set(getattr(processor, "unused_input_names", None) or ())
    inputs = {name: torch.as_tensor(value) for name, value in made.items() if name not in unused}
    warn_cut(inputs, clips, paths, extractor)
    return inputs


def audio_placeholder(processor: Any, token: str) -> str:
    """The audio placeholder as the processor's chat template writes an audio item: the audio token with the added
    tokens the template puts right around it (Qwen2-Audio's and Qwen Omni's ``<|audio_bos|><|AUDIO|><|audio_eos|>``,
    the form the model was trained on); the token alone for a processor without a chat template, or whose template
    writes the token alone (its processor adds the rest, as Music Flamingo's does) or no audio item."""
    tokenizer: Any = getattr(processor, "tokenizer", None)
    if not getattr(processor, "chat_template", None) or not hasattr(tokenizer, "get_added_vocab"):
        return token
    before, after = "\u27e6before\u27e7", "\u27e6after\u27e7"  # text no template writes itself
    items = [{"type": "text", "text": before}, {"type": "audio", "path": "audio.wav"}, {"type": "text", "text": after}]
    try:
        rendered = str(processor.apply_chat_template([{"role": "user", "content": items}], tokenize=False))
    except Exception:  # noqa: BLE001 -- a template that takes no audio item (jinja's errors, or the processor's)
        return token
    start, end = rendered.find(before), rendered.find(after)
    span = rendered[start + len(before) : end] if 0 <= start < end else ""
    if span.count(token) != 1:
        return token
    head, tail = span.split(token)
    added = sorted((name for name in tokenizer.get_added_vocab() if name and name != token), key=len, reverse=True)
    form = token
    while found := next((name for name in added if head.endswith(name)), None):
        form, head = found + form, head[: -len(found)]
    while found := next((name for name in added if tail.startswith(name)), None):
        form, tail = form + found, tail[len(found) :]
    return form


def check_placeholders(prompts: list[str], token: str, form: str) -> None:
    """Each prompt holds the audio placeholder, in the form the processor's chat template writes it
    (:func:`audio_placeholder`), or an error naming that form."""
    example = f"--prompt '{form}{'' if form != token else ' '}Transcribe the audio.'"
    if not all(token in text for text in prompts):
        raise InputError(
            f"a prompt lacks the audio placeholder {token!r}: the processor puts the audio's tokens there",
            fix=f"write {form!r} where the audio goes, e.g. {example}",
        )
    if form != token and any(text.count(token) != text.count(form) for text in prompts):
        raise InputError(
            f"a prompt holds the audio placeholder {token!r} without the tokens the processor's chat template writes "
            f"around it: {form!r} (the model was trained on that form)",
            fix=f"write {form!r} where the audio goes, e.g. {example}",
        )


def frame_masks(inputs: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """The processor's masks of feature frames with one row per audio (Qwen Omni's ``feature_attention_mask``),
    by name; none when the processor cut the audio into windows (GLM-ASR's: more rows than audio files)."""
    features = inputs.get("input_features")
    if features is None:
        return {}
    return {
        name: value
        for name, value in inputs.items()
        if name.endswith("mask")
        and name != "attention_mask"
        and value.dim() == 2
        and value.shape == (rows, features.shape[-1])
    }


def warn_cut(inputs: dict[str, torch.Tensor], clips: list[np.ndarray], paths: list[Path], extractor: Any) -> None:
    """A warning for each audio the processor heard only the start of (longer than its feature extractor's window,
    which Whisper's extractor cuts it to), never a silent cut."""
    import warnings

    hop, rate = getattr(extractor, "hop_length", None), getattr(extractor, "sampling_rate", None)
    if not isinstance(hop, int) or not isinstance(rate, int):
        return
    mask = next(iter(frame_masks(inputs, len(clips)).values()), None)
    for path, samples, row in zip(paths, clips, mask if mask is not None else [], strict=False):
        heard = int(row.sum()) * hop
        if len(samples) > heard + hop:  # more than a frame's samples past the frames kept
            warnings.warn(
                f"--audio {path} is {len(samples) / rate:.2f} s; the processor keeps its first {heard / rate:g} s "
                "(its feature extractor's window)",
                stacklevel=2,
            )


def check_audio_frames(module: Any, inputs: dict[str, torch.Tensor], paths: list[Path], processor: Any) -> None:
    """Each audio fills the feature frames the artifact's audio graph was converted for, where that graph holds its
    sample's frame mask (Qwen Omni's tower selects the frames by ``feature_attention_mask``, sizes decided in
    Python): an audio of another length is refused in seconds, naming the length the artifact takes."""
    import torch

    held = getattr(module, "fixed_inputs", None) or {}
    for name, mask in frame_masks(inputs, len(paths)).items():
        fixed = held.get(name)
        if fixed is None or fixed.dim() != 2 or fixed.shape[0] != 1 or not bool(((fixed == 0) | (fixed == 1)).all()):
            continue
        for path, row in zip(paths, mask, strict=True):
            if row.shape == fixed[0].shape and torch.equal(row.to(fixed.dtype), fixed[0]):
                continue
            frames, wanted = int(row.sum()), int(fixed.sum())
            length = _seconds(wanted, processor)
            # the sample filled the window: longer audio is cut to it; else the sample's length alone
            takes = f"at least {length} s" if wanted == fixed.shape[-1] == row.shape[-1] else f"{length} s exactly"
            edit = (
                f"cut it: ffmpeg -i {path.name} -t {length} out.wav"
                if frames > wanted
                else f"pad it with silence: ffmpeg -i {path.name} -af apad=whole_dur={length} out.wav"
            )
            raise InputError(
                f"--audio {path} fills {frames} feature frames ({_seconds(frames, processor)} s), but the artifact's "
                f"audio graph was converted for {wanted} (it holds its sample's {name}, from which the model's audio "
                f"tower decides sizes): it takes audio of {takes}",
                fix=f"give audio of {takes} ({edit}), or convert from a sample of this audio's length",
            )


def _seconds(frames: int, processor: Any) -> str:
    """``frames`` feature frames in seconds of audio, by the processor's feature extractor's hop and rate."""
    extractor = getattr(processor, "feature_extractor", None)
    hop, rate = getattr(extractor, "hop_length", None), getattr(extractor, "sampling_rate", None)
    return f"{frames * hop / rate:g}" if isinstance(hop, int) and isinstance(rate, int) and rate else "?"


def takes_audio(processor: Any) -> bool:
    """Whether the processor's call takes ``audio=`` beside the text (GLM-ASR's, Audio Flamingo 3's, Qwen2-Audio's);
    Voxtral's takes text alone, its audio only through its chat template."""
    import inspect

    try:
        parameters = inspect.signature(processor.__call__).parameters
    except (TypeError, ValueError):  # a call without a signature: the plain path, whose refusal names the fix
        return True
    return "audio" in parameters


def chat_prompts(processor: Any, prompts: list[str], paths: list[Path]) -> dict[str, torch.Tensor]:
    """An audio-language decoder's inputs through its processor's chat template, for a processor that takes audio
    only there (Voxtral's): each row a user turn of its audio file (``{"type": "audio", "path": ...}``, read and
    resampled by the template's tokenizer) then its prompt's text, with the generation prompt; left-padded as a
    decoder-only model's batch is. The template writes the audio's tokens (Voxtral's ``[BEGIN_AUDIO]`` and its run of
    ``[AUDIO]``) and makes the audio features."""
    import torch

    token = getattr(processor, "audio_token", None)
    if isinstance(token, str) and token and any(token in text for text in prompts):
        raise InputError(
            f"a prompt holds the audio placeholder {token!r}, but --processor {type(processor).__name__} places each "
            "audio itself (through its chat template, before the prompt's text)",
            fix=f"drop {token!r} from the prompt: --prompt 'Transcribe the audio.'",
        )
    for path in paths:
        read_wav(path)  # a WAV that reads, or an error naming the fix, before the template's own reader sees it
    conversations = [
        [{"role": "user", "content": [{"type": "audio", "path": str(path.resolve())}, {"type": "text", "text": text}]}]
        for text, path in zip(prompts, paths, strict=True)
    ]
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is not None:
        tokenizer.padding_side = "left"
    needs = (
        "a processor whose chat template takes audio items (Voxtral's needs mistral-common's tokenizer: pip install "
        "'mistral-common[audio]', and the checkpoint's config.json beside its tekken.json, so that the tokenizer loads "
        "as MistralCommonBackend)"
    )
    try:
        made = processor.apply_chat_template(
            conversations,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            add_generation_prompt=True,
            processor_kwargs={"padding": True},
        )
    except Exception as exc:  # noqa: BLE001 -- the processor's own refusals (mistral-common's are not ValueErrors)
        raise InputError(
            f"--processor {type(processor).__name__} takes audio only through its chat template, which refuses the "
            f"prompts and audio: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
            fix=f"give {needs}",
        ) from exc
    unused = set(getattr(processor, "unused_input_names", None) or ())
    inputs = {name: torch.as_tensor(value) for name, value in made.items() if name not in unused}
    if not set(inputs) - {"input_ids", "attention_mask"}:
        raise InputError(
            f"--processor {type(processor).__name__} takes audio only through its chat template, which made no audio "
            f"inputs (only {', '.join(inputs)})",
            fix=f"give {needs}",
        )
    return inputs
