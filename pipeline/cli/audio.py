"""``pipeline generate --audio FILE.wav --feature-extractor DIR``: audio files through a speech model's own feature
extractor, into the inputs its encoder takes.

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


def audio_inputs(paths: list[Path], directory: Path | None, takes: list[str]) -> dict[str, torch.Tensor]:
    """The encoder's inputs (those of ``takes`` the extractor makes) for the audio files, one row each."""
    import torch

    if directory is None:
        raise InputError("--audio needs the model's feature extractor", fix="pass --feature-extractor DIR")
    extractor = load_feature_extractor(directory)
    rate = getattr(extractor, "sampling_rate", None)
    clips = []
    for path in paths:
        samples, found = read_wav(path)
        if rate is not None and found != rate:
            raise InputError(
                f"--audio {path} is sampled at {found} Hz; the feature extractor takes {rate} Hz",
                fix=f"resample it, e.g. ffmpeg -i {path.name} -ac 1 -ar {rate} out.wav",
            )
        clips.append(samples)
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
