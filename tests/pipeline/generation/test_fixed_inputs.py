"""Fixed model inputs: a scalar of the generation sample whose name is a parameter of the model's forward
(VibeVoice-ASR's ``sample=False``, without which its ``get_audio_features`` adds noise to its latents) is kept, passed
to the features method and to the model's ``generate`` when validating, and recorded in the module's generation
settings: its ``generate`` takes the same value (and drops it) and refuses another, saying how to convert for it.
Without the option the conversion's refusal names it. A tiny VibeVoice-ASR (tokenizers of one downsampling stage of
320: 5 audio tokens per 1600 samples) decodes a left-padded batch of two as ``model.generate(..., sample=False)`` does,
greedy and 4 beams, saved and loaded. Nothing is downloaded."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import converted_for_rtx_when_it_imports

import pipeline
from converters.errors import InputError
from pipeline.runtime.generation.vision_language import VisionLanguageModule

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import vision_language_families as sweep  # noqa: E402 -- the sweep's audio sample, batch and lively weights

GENERATION = {"max_length": 32, "max_batch": 8, "validation_steps": 2}
GREEDY: dict[str, Any] = {"max_new_tokens": 8, "do_sample": False}
TOKENIZER = {"hidden_size": 32, "num_filters": 4, "downsampling_ratios": [320], "depths": [1, 1]}


@pytest.fixture(scope="module")
def model_and_inputs() -> tuple[Any, dict[str, Any]]:
    """A tiny VibeVoice-ASR, its weights drawn wider and eos off, and a batch of two prompts (another audio each, the
    first left-padded) with ``sample=False``."""
    torch.manual_seed(0)
    text = {"model_type": "qwen2", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64}
    text |= {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64}
    config = transformers.VibeVoiceAsrConfig(
        text_config=text,
        acoustic_tokenizer_encoder_config=TOKENIZER,
        semantic_tokenizer_encoder_config=TOKENIZER,
        audio_token_id=127,
        audio_bos_token_id=126,
        audio_eos_token_id=125,
    )
    model = sweep.quiet(transformers.VibeVoiceAsrForConditionalGeneration(config).eval())
    inputs = sweep.batch_of_two(sweep.audio_sample(model))
    return model, {**inputs, "sample": False}


@pytest.fixture(scope="module")
def module(model_and_inputs: tuple[Any, dict[str, Any]]) -> VisionLanguageModule:
    model, inputs = model_and_inputs
    converted = pipeline.convert(model, inputs, generation=GENERATION, validate=True)
    assert isinstance(converted, VisionLanguageModule)
    return converted


def test_greedy_and_beams_equal_transformers_with_the_option(
    model_and_inputs: tuple[Any, dict[str, Any]], module: VisionLanguageModule
) -> None:
    model, inputs = model_and_inputs
    assert module.generation.fixed_inputs == (("sample", False),)
    with torch.no_grad():
        greedy = model.generate(**inputs, **GREEDY)
        beams = model.generate(**inputs, **GREEDY, num_beams=4)
    assert len(set(greedy[:, inputs["input_ids"].shape[1] :].flatten().tolist())) > 3  # tokens that vary
    assert torch.equal(module.generate(**inputs, **GREEDY), greedy)
    assert torch.equal(module.generate(**inputs, **GREEDY, num_beams=4), beams)
    without = {name: value for name, value in inputs.items() if name != "sample"}
    assert torch.equal(module.generate(**without, **GREEDY), greedy)  # the converted value: the option's default


def test_saved_and_loaded_keeps_the_option(
    model_and_inputs: tuple[Any, dict[str, Any]], module: VisionLanguageModule, tmp_path: Path
) -> None:
    _, inputs = model_and_inputs
    loaded = pipeline.load(module.save(tmp_path / "vibevoice"))
    assert loaded.generation.fixed_inputs == (("sample", False),)
    assert torch.equal(loaded.generate(**inputs, **GREEDY), module.generate(**inputs, **GREEDY))
    with pytest.raises(InputError, match=r"converted with sample=False") as refused:
        list(loaded.stream(**{**inputs, "sample": True}, **GREEDY))
    assert "sample=True in the generation sample" in (refused.value.fix or "")


def test_another_value_is_refused_with_the_fix(
    model_and_inputs: tuple[Any, dict[str, Any]], module: VisionLanguageModule
) -> None:
    _, inputs = model_and_inputs
    for value in (True, 0):  # another value, and another type (the graphs hold the bool)
        with pytest.raises(InputError, match=r"the module was converted with sample=False") as refused:
            module.generate(**{**inputs, "sample": value}, **GREEDY)
        assert f"convert again with sample={value!r} in the generation sample" in (refused.value.fix or "")


def test_without_the_option_the_refusal_names_it(model_and_inputs: tuple[Any, dict[str, Any]]) -> None:
    model, inputs = model_and_inputs
    drawing = {name: value for name, value in inputs.items() if name != "sample"}
    with pytest.raises(InputError, match="draws random numbers") as refused:
        pipeline.convert(model, drawing, generation=GENERATION, validate=False)
    assert "pass sample=False in the generation sample given to pipeline.convert" in (refused.value.fix or "")


def test_other_non_tensors_are_refused_saying_why(model_and_inputs: tuple[Any, dict[str, Any]]) -> None:
    model, inputs = model_and_inputs
    with pytest.raises(InputError, match=r"chunks \(list: neither a tensor nor a scalar option") as refused:
        pipeline.convert(model, {**inputs, "chunks": [1, 2]}, generation=GENERATION, validate=False)
    assert "sample=False" in (refused.value.fix or "")
    with pytest.raises(InputError, match=r"temperature \(float: VibeVoiceAsrForConditionalGeneration.forward takes no"):
        pipeline.convert(model, {**inputs, "temperature": 0.5}, generation=GENERATION, validate=False)


def test_tensorrt_rtx_builds_both_graphs_with_the_option(model_and_inputs: tuple[Any, dict[str, Any]]) -> None:
    """The features graph traced with ``sample=False`` (no noise drawn) and the step: the real builder builds both."""
    pytest.importorskip("tensorrt_rtx")
    built = converted_for_rtx_when_it_imports(*model_and_inputs, GENERATION)
    assert built.generation.fixed_inputs == (("sample", False),)
    assert built.vision.engine_bytes and built.step.engine_bytes
