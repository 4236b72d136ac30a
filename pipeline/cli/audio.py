"""``pipeline generate --audio FILE.wav --feature-extractor DIR``: audio files through a speech model's own feature
extractor, into the inputs its encoder takes; ``pipeline generate DIR --processor P --audio FILE.wav --prompt TEXT``:
an audio-language decoder's prompts (GLM-ASR's, Audio Flamingo 3's, Qwen3-ASR's: text with the processor's audio
placeholder, one audio each) through its own processor (:func:`audio_prompts`), which writes the audio's tokens where
each prompt holds the placeholder and makes the audio features the model takes. A processor whose call takes no audio
(Voxtral's: audio only through its chat template, ``mistral-common``'s tokenizer) is given each prompt as a user turn
of its audio file and its text (:func:`chat_prompts`).

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
    if isinstance(token, str) and token and not all(token in text for text in prompts):
        raise InputError(
            f"a prompt lacks the audio placeholder {token!r}: the processor puts the audio's tokens there",
            fix=f"write {token!r} where the audio goes, e.g. --prompt '{token} Transcribe the audio.'",
        )
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
    return {name: torch.as_tensor(value) for name, value in made.items() if name not in unused}


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
