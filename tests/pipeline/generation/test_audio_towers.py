"""Audio towers found in the forward (:mod:`pipeline.generation.audio_features`): Qwen2-Audio has no
``get_audio_features``; its forward runs its audio tower and projector and places their output at its audio tokens. The
conversion finds the two modules there (hooks on the sample's forward) and converts them as the features graph. A tiny
Qwen2-Audio then decodes a left-padded batch of two prompts (another audio each) as ``model.generate`` does: greedy
tokens, every step's scores, 4 beams; TensorRT-RTX's real builder builds both graphs (one conversion: for TensorRT-RTX
when it imports, its graphs run on ONNX Runtime beside the engines). An audio whose frame mask drops frames (the
forward crops its features by code of its own, no module) gives no features: its prompt is refused, not given the whole
audio's features. A model whose forward places nothing found so is refused with the reason."""

from __future__ import annotations

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
from pipeline.generation.audio_features import find_features, why_not_found
from pipeline.runtime.generation.vision_language import VisionLanguageModule

GENERATION = {"max_length": 40, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 6, "do_sample": False}
AUDIO_TOKEN = 127
MELS, FRAMES = 8, 32  # the tower takes 2 x max_source_positions frames: 16 positions, pooled by 2 to 8 features
FEATURES = 8


def qwen2_audio() -> Any:
    """A tiny Qwen2-Audio, its weights drawn by fan-in."""
    torch.manual_seed(0)
    audio = transformers.Qwen2AudioEncoderConfig(
        num_mel_bins=MELS, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16
    )
    audio.max_source_positions = FRAMES // 2
    config = transformers.Qwen2AudioConfig(
        audio_config=audio, text_config=transformers.Qwen2Config(**TINY_TEXT), audio_token_index=AUDIO_TOKEN
    )
    return drawn_by_fan_in(transformers.Qwen2AudioForConditionalGeneration(config))


def batch(frames: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Two prompts of text around each one's 8 audio tokens, the second left-padded by 2, their audios (every frame
    valid unless ``frames`` says which are)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 8 + FEATURES), generator=generator)
    mask = torch.ones_like(ids)
    ids[:, 2 : 2 + FEATURES] = AUDIO_TOKEN
    ids[1, :2], mask[1, :2] = 0, 0
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "input_features": torch.randn(2, MELS, FRAMES, generator=torch.Generator().manual_seed(2)),
        "feature_attention_mask": frames if frames is not None else torch.ones(2, FRAMES, dtype=torch.long),
    }


@pytest.fixture(scope="module")
def converted() -> tuple[Any, VisionLanguageModule]:
    model = qwen2_audio()
    module = converted_for_rtx_when_it_imports(model, batch(), GENERATION)
    assert isinstance(module, VisionLanguageModule)
    return model, module


def test_qwen2_audio_decodes_as_transformers(converted: tuple[Any, VisionLanguageModule]) -> None:
    model, module = converted
    assert not hasattr(model, "get_audio_features")  # its forward computes the features: found there
    # the frame mask is an input of the features graph, or held at every frame (the graph for TensorRT, whose parser
    # refuses the selection by it)
    taken = [spec.name for spec in module.vision.io.inputs]
    assert taken + list(module.fixed_inputs) == ["input_features", "feature_attention_mask"]
    decodes_its_audio_as_transformers(model, module, batch(), **GREEDY)


def test_tensorrt_rtx_builds_both_graphs(converted: tuple[Any, VisionLanguageModule]) -> None:
    pytest.importorskip("tensorrt_rtx")
    _, module = converted
    assert module.vision.engine_bytes and module.step.engine_bytes


def test_an_audio_with_dropped_frames_is_refused(converted: tuple[Any, VisionLanguageModule]) -> None:
    """The forward crops a padded audio's features by its own code: the features graph gives none for it, and the
    prompt's audio tokens are refused rather than given the whole audio's features (the graph for TensorRT holds the
    mask at every frame: a mask that drops frames is refused as not the one it was converted for)."""
    _, module = converted
    frames = torch.ones(2, FRAMES, dtype=torch.long)
    frames[1, -8:] = 0
    refused = "feature_attention_mask of audio 1 is" if module.fixed_inputs else "audio tokens"
    with pytest.raises(InputError, match=refused):
        module.generate(**batch(frames), **GREEDY)


def test_a_forward_whose_features_are_not_found_is_refused_with_the_reason() -> None:
    """The same model with its audio tokens left out of the prompt: nothing of its forward is placed at them, so no
    features method is found, and the conversion's refusal says why."""
    model = qwen2_audio()
    inputs = batch()
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["input_ids"] == AUDIO_TOKEN, 5)
    assert find_features(model, inputs, "input_features", AUDIO_TOKEN) is not None
    with pytest.raises(InputError, match="no get_audio_features .* where they were not found: the sample's prompt"):
        pipeline.convert(model, inputs, generation=GENERATION)
    assert "holds none of its audio tokens" in str(why_not_found(model))


def test_on_onnx_runtime_saved_and_loaded_and_an_audio_with_dropped_frames_gives_none(tmp_path: Any) -> None:
    """For ONNX Runtime the features graph takes the frame mask and selects by it: a mask that drops frames gives no
    features, and the prompt's audio tokens are refused; the module saved and loaded decodes as before."""
    model = qwen2_audio()
    module = pipeline.convert(model, batch(), generation=GENERATION, validate=False)
    assert [spec.name for spec in module.vision.io.inputs] == ["input_features", "feature_attention_mask"]
    frames = torch.ones(2, FRAMES, dtype=torch.long)
    frames[1, -8:] = 0
    refused = rf"the prompts hold {2 * FEATURES} audio tokens .* the audio gives {FEATURES} "
    with pytest.raises(InputError, match=refused):
        module.generate(**batch(frames), **GREEDY)
    module.save(tmp_path / "qwen2_audio")
    loaded = pipeline.load(tmp_path / "qwen2_audio")
    with torch.no_grad():
        assert torch.equal(loaded.generate(**batch(), **GREEDY), model.generate(**batch(), **GREEDY))
