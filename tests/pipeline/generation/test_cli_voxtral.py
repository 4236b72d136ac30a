"""``pipeline generate DIR --processor P --prompt TEXT --audio a.wav`` on a converted Voxtral, whose processor takes
audio only through its chat template (mistral-common's tokenizer): each prompt becomes a user turn of its audio file
and its text, and the template writes ``[BEGIN_AUDIO]``, the audio's run of ``[AUDIO]`` tokens (375 for each 30 s
chunk) and the features. The processor is built here (a byte-level tekken.json with Voxtral's special tokens and
audio settings, Whisper's feature extractor of the tiny tower's 8 mels) and saved as a checkpoint's directory is
(its config.json beside its tekken.json); the tiny Voxtral's tower has the real 1500 positions (3000 frames: 30 s).
It is converted for TensorRT-RTX when it imports (its real builder builds both graphs; they run on ONNX Runtime here),
else for ONNX Runtime. The printed tokens are the module's ``generate`` on the template's inputs, and those
transformers' greedy ``model.generate``. Without mistral-common's tokenizer (a directory without config.json loads the
tekken.json as a plain tokenizer) the chat template takes no audio: an error naming the fix. Nothing is downloaded."""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import TINY_TEXT, converted_for_rtx_when_it_imports, drawn_by_fan_in, tone_wav

from pipeline.runtime.generation.vision_language import VisionLanguageModule

pytest.importorskip("mistral_common", reason="Voxtral's processor takes audio through mistral-common's tokenizer")
pytest.importorskip("soundfile", reason="mistral-common reads audio files with soundfile")

RATE = 16000
MELS = 8
AUDIO_TOKEN = 24  # VoxtralProcessor's audio_token_id
#: Voxtral's tekken special tokens up to [TRANSCRIBE] (ranks 20-23 and 26-33 are fillers here).
SPECIAL = [
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
    "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "<SPECIAL_20>", "<SPECIAL_21>",
    "<SPECIAL_22>", "<SPECIAL_23>", "[AUDIO]", "[BEGIN_AUDIO]", "[ARGS]", "[CALL_ID]", "[TRANSCRIBE]",
]  # fmt: skip
SPECIALS = 32
VOCABULARY = SPECIALS + 256  # the special tokens, then one token per byte
GENERATION = {"max_length": 440, "max_batch": 2}  # a prompt: 4 tokens, 375 audio tokens and its text's bytes
NEW_TOKENS = 6


def tekken(path: Path) -> Path:
    """A tekken.json of byte tokens (no merges) with Voxtral's audio settings: 16 kHz, 12.5 tokens a second, audio
    padded to 30 s chunks."""
    vocab = [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(), "token_str": None} for i in range(256)]
    model = {
        "config": {
            "pattern": r"\S+|\s+",
            "num_vocab_tokens": 256,
            "default_vocab_size": VOCABULARY,
            "default_num_special_tokens": SPECIALS,
            "version": "v7",
        },
        "vocab": vocab,
        "special_tokens": [{"rank": i, "token_str": token, "is_control": True} for i, token in enumerate(SPECIAL)],
        "version": 1,
        "type": "Tekken",
        "audio": {
            "sampling_rate": RATE,
            "frame_rate": 12.5,
            "chunk_length_s": 30.0,
            "audio_encoding_config": {"num_mel_bins": MELS, "hop_length": 160, "window_size": 400},
        },
    }
    path.write_text(json.dumps(model))
    return path


def write_wav(path: Path, seconds: float, hertz: float) -> str:
    """A 16-bit mono PCM WAV at :data:`RATE` of two tones (:func:`tiny_models.tone_wav`)."""
    return str(tone_wav(path, seconds, hertz, RATE))


def conversations(prompts: list[str], files: list[str]) -> list[list[dict[str, Any]]]:
    """Each prompt as a user turn of its audio file and its text."""
    return [
        [{"role": "user", "content": [{"type": "audio", "path": file}, {"type": "text", "text": text}]}]
        for text, file in zip(prompts, files, strict=True)
    ]


def template_inputs(processor: Any, prompts: list[str], files: list[str]) -> dict[str, torch.Tensor]:
    """The processor's chat template's inputs for the prompts and audio files, left-padded."""
    made = processor.apply_chat_template(
        conversations(prompts, files), tokenize=True, return_dict=True, return_tensors="pt", add_generation_prompt=True,
        processor_kwargs={"padding": True},
    )  # fmt: skip
    return dict(made)


@pytest.fixture(scope="module")
def voxtral(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, VisionLanguageModule, Any, Path]:
    """A tiny Voxtral converted from its processor's output for two prompts and audio files, the model, the processor
    loaded back from its saved directory, and that directory."""
    from transformers.tokenization_mistral_common import MistralCommonBackend

    root = tmp_path_factory.mktemp("voxtral")
    extractor = transformers.WhisperFeatureExtractor(
        feature_size=MELS, sampling_rate=RATE, hop_length=160, chunk_length=30, n_fft=400
    )
    tokenizer = MistralCommonBackend(tokenizer_path=str(tekken(root / "tekken.json")))
    directory = root / "processor"
    transformers.VoxtralProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(directory)
    tower = transformers.VoxtralEncoderConfig(
        num_mel_bins=MELS, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, hidden_size=16,
        max_source_positions=1500,
    )  # fmt: skip
    text = transformers.LlamaConfig(**{**TINY_TEXT, "vocab_size": VOCABULARY})
    config = transformers.VoxtralConfig(audio_config=tower, text_config=text, audio_token_id=AUDIO_TOKEN)
    config.save_pretrained(directory)  # as a checkpoint's directory: its model type loads mistral-common's tokenizer
    processor = transformers.AutoProcessor.from_pretrained(str(directory), local_files_only=True)
    assert type(processor.tokenizer).__name__ == "MistralCommonBackend"
    torch.manual_seed(2)
    model = drawn_by_fan_in(transformers.VoxtralForConditionalGeneration(config), torch.Generator().manual_seed(2))
    files = [write_wav(root / "a.wav", 1.0, 330.0), write_wav(root / "b.wav", 0.7, 500.0)]
    sample = template_inputs(processor, ["What is it?", "Say it again, slower"], files)
    module = converted_for_rtx_when_it_imports(model, sample, GENERATION)
    assert isinstance(module, VisionLanguageModule) and module.modality == "audio"
    if importlib.util.find_spec("tensorrt_rtx") is not None:  # its real builder built both graphs
        assert module.vision.engine_bytes and module.step.engine_bytes
    return model, module, processor, directory


def test_the_cli_generates_from_audio_through_the_chat_template(
    voxtral: tuple[Any, VisionLanguageModule, Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two prompts with two audio files (1.5 s and 0.4 s): the printed lines are the module's greedy tokens on the
    chat template's inputs (left-padded: the second prompt is shorter), and those are transformers'."""
    from pipeline.cli import main

    model, module, processor, directory = voxtral
    files = [write_wav(tmp_path / "one.wav", 1.5, 220.0), write_wav(tmp_path / "two.wav", 0.4, 880.0)]
    prompts = ["Transcribe the audio.", "Why?"]
    target = module.save(tmp_path / "voxtral")
    pairs = [item for text, file in zip(prompts, files, strict=True) for item in ("--prompt", text, "--audio", file)]
    command = ["generate", str(target), "--processor", str(directory), *pairs, "--max-new-tokens", str(NEW_TOKENS)]
    assert main(command) == 0
    printed = capsys.readouterr().out.splitlines()
    inputs = template_inputs(processor, prompts, files)
    ids = inputs["input_ids"]
    assert ids[:, :3].tolist()[0] == [1, 3, 25] and int((ids == AUDIO_TOKEN).sum()) == 2 * 375
    assert inputs["attention_mask"][1, 0] == 0 and tuple(inputs["input_features"].shape) == (2, MELS, 3000)
    ours = module.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.no_grad():
        theirs = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert torch.equal(ours, theirs)
    new = ours[:, ids.shape[1] :]
    assert len(set(new.flatten().tolist())) > 3  # not one token repeated
    assert printed == [processor.tokenizer.decode(row, skip_special_tokens=True) for row in new.tolist()]


def test_a_placeholder_or_a_tokenizer_without_audio_is_refused(
    voxtral: tuple[Any, VisionLanguageModule, Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The template places the audio itself: a prompt holding ``[AUDIO]`` is refused. The processor's directory
    without config.json loads its tekken.json as a plain tokenizer, whose chat template takes no audio: the error says
    so and names mistral-common and the config.json."""
    from pipeline.cli import main

    _, module, _, directory = voxtral
    target = module.save(tmp_path / "voxtral")
    audio = write_wav(tmp_path / "a.wav", 0.5, 440.0)
    command = ["generate", str(target), "--processor", str(directory), "--audio", audio, "--max-new-tokens", "2"]
    assert main([*command, "--prompt", "[AUDIO] Transcribe."]) == 1
    err = capsys.readouterr().err
    assert "a prompt holds the audio placeholder '[AUDIO]'" in err and "drop '[AUDIO]' from the prompt" in err
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("processor_config.json", "tekken.json"):
        (plain / name).write_bytes((directory / name).read_bytes())
    assert main(["generate", str(target), "--processor", str(plain), "--audio", audio, "--prompt", "Transcribe."]) == 1
    err = capsys.readouterr().err
    assert "takes audio only through its chat template" in err
    assert "pip install 'mistral-common[audio]'" in err and "config.json beside its tekken.json" in err
