"""Audio-language decoders (Voxtral, GLM-ASR, Audio Flamingo 3, ...): a decoder-only LM whose audio tower's features
(``get_audio_features``) replace the embeddings of its config's audio token. They take the vision-language path with
audio in place of images: the features graph is ``get_audio_features`` (tower and projector), the cached text step
places its rows at the audio tokens. A tiny Voxtral decodes a left-padded batch of two prompts (another audio each) as
``model.generate`` does: greedy tokens, every step's scores, 4 beams, saved and loaded; TensorRT-RTX's real builder
builds both graphs. One conversion serves every test: for TensorRT-RTX when it imports (its engines cannot run here,
and the graphs run on ONNX Runtime beside them), else for ONNX Runtime. A model whose forward computes its audio
features itself (Qwen2-Audio: no ``get_audio_features``) is refused by name. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import converted_for_rtx_when_it_imports, drawn_by_fan_in, greedy_scores

import pipeline
from converters.errors import InputError
from pipeline.generation.vision_inputs import AUDIO, IMAGES, modality_of
from pipeline.runtime.generation.vision_language import VisionLanguageModule

GENERATION = {"max_length": 40, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 8, "do_sample": False}
TEXT = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}
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
    assert [spec.name for spec in module.vision.io.inputs] == ["input_features"]


def test_greedy_scores_and_beams_equal_transformers(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule
) -> None:
    model, inputs = model_and_inputs
    expected, expected_scores = greedy_scores(model.generate, inputs, **GREEDY)
    new = expected[:, inputs["input_ids"].shape[1] :]
    assert len(set(new.flatten().tolist())) > 4  # not one token repeated
    tokens, scores = greedy_scores(module.generate, inputs, **GREEDY)
    assert torch.equal(tokens, expected)
    assert float((scores - expected_scores).abs().max()) < 1e-3
    beams = {**GREEDY, "num_beams": 4}
    with torch.no_grad():
        assert torch.equal(module.generate(**inputs, **beams), model.generate(**inputs, **beams))
    # another audio decodes otherwise, in both: the audio reaches the prompt (the test can fail)
    other = {**inputs, "input_features": inputs["input_features"].flip(-1)}
    with torch.no_grad():
        theirs = model.generate(**other, **GREEDY)
    assert torch.equal(module.generate(**other, **GREEDY), theirs) and not torch.equal(theirs, expected)


def test_saved_and_loaded_equal(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule, tmp_path: Path
) -> None:
    _, inputs = model_and_inputs
    module.save(tmp_path / "voxtral")
    loaded = pipeline.load(tmp_path / "voxtral")
    assert torch.equal(loaded.generate(**inputs, **GREEDY), module.generate(**inputs, **GREEDY))


def test_audio_tokens_not_matching_the_features_are_refused(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule
) -> None:
    _, inputs = model_and_inputs
    fewer = {**inputs, "input_ids": inputs["input_ids"].masked_fill(inputs["input_ids"] == AUDIO_TOKEN, 5)}
    with pytest.raises(InputError, match="image tokens|audio tokens"):
        module.generate(**fewer, **GREEDY)


def test_tensorrt_rtx_builds_both_graphs(module: VisionLanguageModule) -> None:
    pytest.importorskip("tensorrt_rtx")
    assert module.vision.engine_bytes and module.step.engine_bytes and module.step.report.segments is None


def test_a_model_computing_its_audio_features_itself_is_refused() -> None:
    """Qwen2-Audio has no ``get_audio_features``: its forward computes and selects its features inline, so there is
    no method to convert as the features graph."""
    audio = transformers.Qwen2AudioEncoderConfig(
        num_mel_bins=MELS, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16
    )
    audio.max_source_positions = FRAMES // 2
    config = transformers.Qwen2AudioConfig(
        audio_config=audio, text_config=transformers.Qwen2Config(**TEXT), audio_token_index=AUDIO_TOKEN
    )
    model = transformers.Qwen2AudioForConditionalGeneration(config).eval()
    sample = {
        **prompts((8, 8), AUDIO_TOKEN),
        "input_features": torch.randn(2, MELS, FRAMES),
        "feature_attention_mask": torch.ones(2, FRAMES, dtype=torch.long),
    }
    with pytest.raises(InputError, match="Qwen2AudioForConditionalGeneration.*no get_audio_features") as error:
        pipeline.convert(model, sample, generation=GENERATION)
    assert error.value.fix
