"""Audio-language decoders (Voxtral, GLM-ASR, Audio Flamingo 3, ...): a decoder-only LM whose audio tower's features
(``get_audio_features``) replace the embeddings of its config's audio token. They take the vision-language path with
audio in place of images: the features graph is ``get_audio_features`` (tower and projector), the cached text step
places its rows at the audio tokens. A tiny Voxtral decodes a left-padded batch of two prompts (another audio each)
as ``model.generate`` does: greedy tokens, every step's scores, 4 beams, saved and loaded; TensorRT-RTX's real
builder builds both graphs. One conversion serves every test: for TensorRT-RTX when it imports (its engines cannot
run here, and the graphs run on ONNX Runtime beside them), else for ONNX Runtime (a model whose forward computes its
audio features itself, Qwen2-Audio: test_audio_towers.py). The module records its modality (saved and loaded: its
errors say "audio tokens"), and ``pipeline generate DIR --processor P --audio a.wav --prompt TEXT`` decodes a tiny
GLM-ASR's prompts through its own processor (built offline: a word-level tokenizer and Whisper's feature extractor)
as its ``generate`` does. Nothing is downloaded."""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import (
    TINY_TEXT,
    converted_for_rtx_when_it_imports,
    decodes_its_audio_as_transformers,
    drawn_by_fan_in,
)

import pipeline
from converters.errors import InputError
from pipeline.cli.convert import generate_command
from pipeline.generation.vision_inputs import AUDIO, IMAGES, modality_of
from pipeline.runtime.generation.image_positions import ImagePositions, image_rows
from pipeline.runtime.generation.vision_language import VisionLanguageModule

GENERATION = {"max_length": 40, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 8, "do_sample": False}
TEXT = TINY_TEXT
AUDIO_TOKEN = 127
MELS, FRAMES = 8, 32  # the tower takes 2 x max_source_positions frames


def prompts(counts: tuple[int, int], token: int) -> dict[str, torch.Tensor]:
    """Two prompts of text and each one's run of ``counts`` audio tokens, the second left-padded by 2 tokens."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 8 + counts[0]), generator=generator)
    mask = torch.ones_like(ids)
    ids[0, 2 : 2 + counts[0]] = token
    pad = 2 + counts[0] - counts[1]
    ids[1, :pad], mask[1, :pad] = 0, 0
    ids[1, pad + 2 : pad + 2 + counts[1]] = token
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def model_and_inputs() -> tuple[Any, dict[str, torch.Tensor]]:
    """A tiny Voxtral (4 features per audio: 16 tower positions of width 16, regrouped by 64) and a batch of two."""
    torch.manual_seed(0)
    audio = transformers.VoxtralEncoderConfig(
        num_mel_bins=MELS,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_size=16,
        max_source_positions=FRAMES // 2,
    )
    config = transformers.VoxtralConfig(
        audio_config=audio, text_config=transformers.LlamaConfig(**TEXT), audio_token_id=AUDIO_TOKEN
    )
    model = drawn_by_fan_in(transformers.VoxtralForConditionalGeneration(config))
    features = torch.randn(2, MELS, FRAMES, generator=torch.Generator().manual_seed(2))
    return model, {**prompts((4, 4), AUDIO_TOKEN), "input_features": features}


@pytest.fixture(scope="module")
def module(model_and_inputs: tuple[Any, dict[str, torch.Tensor]]) -> VisionLanguageModule:
    converted = converted_for_rtx_when_it_imports(*model_and_inputs, GENERATION)
    assert isinstance(converted, VisionLanguageModule)
    return converted


def test_the_sample_names_the_modality(module: VisionLanguageModule) -> None:
    assert modality_of(["input_ids", "input_features"]) is AUDIO
    assert modality_of(["input_features", "pixel_values"]) is IMAGES  # an image-text model's own audio: images first
    assert module.image_token_id == AUDIO_TOKEN  # the config's audio_token_id
    assert (module.modality, module.placeholder) == ("audio", "audio")
    assert [spec.name for spec in module.vision.io.inputs] == ["input_features"]


def test_greedy_scores_and_beams_equal_transformers(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule
) -> None:
    model, inputs = model_and_inputs
    decodes_its_audio_as_transformers(model, module, inputs, distinct=4, **GREEDY)  # not one token repeated


def test_saved_and_loaded_equal(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule, tmp_path: Path
) -> None:
    _, inputs = model_and_inputs
    module.save(tmp_path / "voxtral")
    loaded = pipeline.load(tmp_path / "voxtral")
    assert torch.equal(loaded.generate(**inputs, **GREEDY), module.generate(**inputs, **GREEDY))
    assert (loaded.modality, loaded.placeholder) == ("audio", "audio")
    # a directory saved before the modality was recorded reads as images
    meta = tmp_path / "voxtral" / "vision_language.json"
    recorded = json.loads(meta.read_text())
    assert recorded["modality"] == "audio"
    meta.write_text(json.dumps({k: v for k, v in recorded.items() if k not in ("modality", "placeholder")}))
    assert pipeline.load(tmp_path / "voxtral").modality == "image"


def test_audio_tokens_not_matching_the_features_are_refused(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule
) -> None:
    _, inputs = model_and_inputs
    fewer = {**inputs, "input_ids": inputs["input_ids"].masked_fill(inputs["input_ids"] == AUDIO_TOKEN, 5)}
    with pytest.raises(InputError, match=rf"the prompts hold 0 audio tokens \({AUDIO_TOKEN}\), but the audio gives 8 "):
        module.generate(**fewer, **GREEDY)
    with pytest.raises(InputError, match="input_features of audio 0 is"):
        module.generate(**{**inputs, "input_features": inputs["input_features"][..., :-2]}, **GREEDY)


def test_tensorrt_rtx_builds_both_graphs(module: VisionLanguageModule) -> None:
    pytest.importorskip("tensorrt_rtx")
    assert module.vision.engine_bytes and module.step.engine_bytes and module.step.report.segments is None


SAMPLING_RATE = 16000  # a window of 1 s: 100 mel frames, 12 audio tokens (50 after the tower's stride-2 convolution)
PLACEHOLDER = "<|pad|>"  # GLM-ASR's processor's audio placeholder


def glmasr_processor(directory: Path) -> Any:
    """GLM-ASR's processor for the tiny GLM-ASR, saved to ``directory``: a word-level tokenizer over the model's 128 ids
    ("w3" is id 3, the placeholder the audio token) and Whisper's feature extractor of its mel count, in windows of
    1 s."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = {"<pad>": 0, "<unk>": 1, "<s>": 2, **{f"w{i}": i for i in range(3, AUDIO_TOKEN)}}
    words = Tokenizer(models.WordLevel({**vocabulary, PLACEHOLDER: AUDIO_TOKEN}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", pad_token="<pad>", extra_special_tokens={"audio_token": PLACEHOLDER}
    )
    extractor = transformers.WhisperFeatureExtractor(
        feature_size=MELS, sampling_rate=SAMPLING_RATE, hop_length=160, chunk_length=1, n_fft=400
    )
    processor = transformers.GlmAsrProcessor(feature_extractor=extractor, tokenizer=tokenizer, audio_token=PLACEHOLDER)
    processor.save_pretrained(directory)
    return processor


def clip(seconds: float, seed: int) -> Any:
    """``seconds`` of a tone and noise as float32 samples in [-1, 1], each a whole number of 16-bit steps (as read
    back from a WAV file)."""
    import numpy as np

    count = int(seconds * SAMPLING_RATE)
    noise = np.random.default_rng(seed).standard_normal(count) * 0.1
    tone = 0.4 * np.sin(2 * np.pi * (220 + 110 * seed) * np.arange(count) / SAMPLING_RATE)
    return (np.round(np.clip(noise + tone, -1, 1) * 32767) / 32768).astype(np.float32)


def write_wav(path: Path, samples: Any) -> str:
    """``samples`` as a 16-bit mono PCM WAV at :data:`SAMPLING_RATE` (the standard library's ``wave``)."""
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(SAMPLING_RATE)
        writer.writeframes((samples * 32768).round().astype("<i2").tobytes())
    return str(path)


@pytest.fixture(scope="module")
def glmasr(tmp_path_factory: pytest.TempPathFactory) -> tuple[VisionLanguageModule, Any, Path]:
    """A tiny GLM-ASR (a Whisper-like tower: 12 features per second of audio) converted from its processor's output
    for two prompts of 1 s of audio each, the processor, and the directory it is saved to."""
    directory = tmp_path_factory.mktemp("glmasr") / "processor"
    processor = glmasr_processor(directory)
    audio = transformers.GlmAsrEncoderConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_mel_bins=MELS,
        max_position_embeddings=64,
    )  # fmt: skip
    config = transformers.GlmAsrConfig(audio_config=audio, text_config=TEXT, audio_token_id=AUDIO_TOKEN)
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.GlmAsrForConditionalGeneration(config))
    texts = [f"w5 {PLACEHOLDER} w9", f"w7 w8 {PLACEHOLDER} w10 w11 w12"]
    sample = dict(processor(text=texts, audio=[clip(1, 0), clip(1, 1)], sampling_rate=SAMPLING_RATE))
    module = pipeline.convert(model, sample, generation=GENERATION, validate=False)
    assert isinstance(module, VisionLanguageModule) and module.modality == "audio"
    return module, processor, directory


def test_the_cli_generates_from_audio_and_prompts_through_the_processor(
    glmasr: tuple[VisionLanguageModule, Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pipeline generate DIR --processor P --audio a.wav --prompt '... <|pad|> ...'`` (twice: 1 s and 0.5 s of
    audio): the processor's prompts, left-padded, and features; each line the prompt's new tokens as text, as the
    module's ``generate`` gives them. A missing placeholder, an image, a prompt without its audio and audio without
    the processor, and audio at another rate than the feature extractor's are refused, each error naming the fix."""
    from pipeline.cli import main

    module, processor, directory = glmasr
    clips = [clip(1, 2), clip(0.5, 3)]
    files = [write_wav(tmp_path / f"{index}.wav", samples) for index, samples in enumerate(clips)]
    prompts = [f"w5 {PLACEHOLDER} w9 w12", f"{PLACEHOLDER} w40 w41 w42 w43 w44"]
    target = module.save(tmp_path / "glmasr")
    hint = generate_command(module, target)
    assert hint.startswith(f"pipeline generate {target} --processor DIR --prompt") and "--audio" in hint
    pairs = [item for text, file in zip(prompts, files, strict=True) for item in ("--prompt", text, "--audio", file)]
    command = ["generate", str(target), "--processor", str(directory), *pairs, "--max-new-tokens", "6"]
    assert main(command) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    processor.tokenizer.padding_side = "left"
    inputs = dict(processor(text=prompts, audio=clips, sampling_rate=SAMPLING_RATE, return_tensors="pt", padding=True))
    assert int((inputs["input_ids"] == AUDIO_TOKEN).sum()) == 12 + 6 and inputs["attention_mask"][1, 0] == 0
    out = module.generate(**inputs, max_new_tokens=6)[:, inputs["input_ids"].shape[1] :]
    assert len(set(out.flatten().tolist())) > 3  # not one token repeated
    assert printed == [processor.tokenizer.decode(row, skip_special_tokens=True) for row in out.tolist()]
    assert main([*command, "--prompt", "w5 w9", "--audio", files[0]]) == 1
    assert f"a prompt lacks the audio placeholder '{PLACEHOLDER}'" in capsys.readouterr().err
    with wave.open(files[1], "rb") as reader:
        frames = reader.readframes(reader.getnframes())
    with wave.open(str(tmp_path / "slow.wav"), "wb") as writer:  # the same samples at half the rate
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(SAMPLING_RATE // 2)
        writer.writeframes(frames)
    assert main([*command, "--prompt", PLACEHOLDER, "--audio", str(tmp_path / "slow.wav")]) == 1
    assert "is sampled at 8000 Hz; the feature extractor takes 16000 Hz" in capsys.readouterr().err
    assert main([*command, "--prompt", f"w5 {PLACEHOLDER}"]) == 1
    assert "3 prompt(s) and 2 audio file(s): each prompt takes one audio" in capsys.readouterr().err
    assert main([*command, "--image", files[0]]) == 1
    assert "--image given, but" in (err := capsys.readouterr().err) and "give --audio FILE instead" in err
    assert main(["generate", str(target), *pairs]) == 1
    assert "(--processor DIR is missing)" in capsys.readouterr().err
    assert main(["generate", str(target), "--processor", str(directory), "--audio", files[0]]) == 1
    assert "(--prompt is missing)" in capsys.readouterr().err


def test_audio_inputs_of_different_counts_are_refused_in_audio_words(
    glmasr: tuple[VisionLanguageModule, Any, Path],
) -> None:
    """GLM-ASR's features graph takes input_features and input_features_mask, one row per audio clip each: a mask for
    one clip beside features for two is refused naming audio clips and both inputs' rows, not images (the module's
    modality); an image module's own error still says images."""
    module, processor, _ = glmasr
    texts = [f"w5 {PLACEHOLDER} w9", f"w7 {PLACEHOLDER} w10"]
    clips = [clip(1, 0), clip(1, 1)]
    inputs = dict(processor(text=texts, audio=clips, sampling_rate=SAMPLING_RATE, return_tensors="pt"))
    assert [spec.name for spec in module.vision.io.inputs] == ["input_features", "input_features_mask"]
    module.generate(**inputs, max_new_tokens=2)  # the whole inputs decode: the next refusal is the mask's alone
    one_mask = {**inputs, "input_features_mask": inputs["input_features_mask"][:1]}
    with pytest.raises(InputError, match=r"the audio inputs have different numbers of audio clips \[1, 2\]") as error:
        module.generate(**one_mask, max_new_tokens=2)
    assert "input_features 2, input_features_mask 1" in str(error.value) and "image" not in str(error.value)
    assert error.value.fix == "pass the processor's audio inputs for the same audio clips (one leading row per audio)"
    with pytest.raises(InputError, match=r"the image inputs have different numbers of images \[1, 2\]"):
        image_rows({"pixel_values": torch.zeros(2, 3, 4, 4), "image_sizes": torch.ones(1, 2, dtype=torch.int64)})


def test_a_partial_run_of_audio_tokens_is_named_so() -> None:
    """Positions laid over several axes (M-RoPE) for a module of audio: a run of its placeholder tokens that is not a
    whole number of clips says audio, as the module's modality; the same for images says images."""
    positions = ImagePositions(torch.zeros(3, 4, dtype=torch.int64), extent=2, image_token=AUDIO_TOKEN)
    ids = torch.tensor([[5, AUDIO_TOKEN, AUDIO_TOKEN, AUDIO_TOKEN, 6]])
    mask = torch.ones_like(ids)
    with pytest.raises(InputError, match="a run of audio tokens .* not a whole number of audio clips of 4") as error:
        positions.prompt(ids, mask, item="audio")
    assert "image" not in str(error.value) + error.value.fix
    with pytest.raises(InputError, match="a run of image tokens .* not a whole number of images of 4"):
        positions.prompt(ids, mask)
    whole = torch.tensor([[5, *[AUDIO_TOKEN] * 4, 6]])
    assert positions.prompt(whole, torch.ones_like(whole), item="audio")[0, 0].tolist() == [0, 1, 1, 1, 1, 3]
