"""Deepstack features (Qwen3-VL's): ``get_image_features`` also gives levels of features that the text model adds to
the hidden states at the image tokens after its first decoder layers, in the prefill only. A small Qwen3-VL whose
``deepstack_visual_indexes`` select both of its tower's layers (the every-type source's small config reaches none of
the default [8, 16, 24], and its deepstack list is empty): the vision graph gives the levels, the step adds them after
the layers the model adds them at (read from the model, placed by a gather), and the module decodes a left-padded
batch of two as ``model.generate`` does, its beams too, saved and loaded; TensorRT-RTX's real builder builds both
graphs. One conversion serves every test (an export of the step takes most of the time): for TensorRT-RTX when it
imports (its engines cannot run here, and the graphs run on ONNX Runtime beside them), else for ONNX Runtime. Nothing
is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers
from model_sources import transformers_all_models as every
from tiny_models import converted_for_rtx_when_it_imports, drawn_by_fan_in, greedy_scores

import pipeline
from pipeline.generation.deepstack import DeepstackLevels, levels_of, placed_levels
from pipeline.runtime.generation.vision_feed import deepstack_name
from pipeline.runtime.generation.vision_language import VisionLanguageModule
from pipeline.serving.repository import _two_graphs

GENERATION = {"max_length": 40, "max_batch": 4}
GREEDY: dict[str, Any] = {"max_new_tokens": 8, "do_sample": False}
PAD = 2


def qwen3_vl() -> tuple[Any, dict[str, torch.Tensor]]:
    """The small Qwen3-VL, its tower's two layers both deepstack layers, its matrices drawn wider (greedy tokens vary)
    and eos off, and a batch of its sample's prompt left-padded by :data:`PAD` and a copy with :data:`PAD` more text
    tokens before it and another image."""
    config = every.shrunk("qwen3_vl")
    config.vision_config.deepstack_visual_indexes = [0, 1]
    torch.manual_seed(0)
    model = transformers.Qwen3VLForConditionalGeneration(config).eval()
    model = drawn_by_fan_in(model)
    sample = next(c for c in every.candidate_samples(model, config) if "image_grid_thw" in c)
    ids, mask, types = sample["input_ids"], sample["attention_mask"], sample["mm_token_type_ids"]
    pad = torch.zeros(1, PAD, dtype=ids.dtype)
    batch = {
        "input_ids": torch.cat([torch.cat([pad, ids], 1), torch.cat([ids[:, -PAD:], ids], 1)]),
        "attention_mask": torch.cat([torch.cat([pad, mask], 1), torch.cat([torch.ones_like(pad), mask], 1)]),
        "mm_token_type_ids": torch.cat([torch.cat([torch.zeros_like(pad), types], 1)] * 2).to(types.dtype),
        "pixel_values": torch.cat([sample["pixel_values"], torch.randn(sample["pixel_values"].shape)]),
        "image_grid_thw": torch.cat([sample["image_grid_thw"]] * 2),
    }
    return model, batch


@pytest.fixture(scope="module")
def model_and_inputs() -> tuple[Any, dict[str, torch.Tensor]]:
    return qwen3_vl()


@pytest.fixture(scope="module")
def module(model_and_inputs: tuple[Any, dict[str, torch.Tensor]]) -> VisionLanguageModule:
    converted = converted_for_rtx_when_it_imports(*model_and_inputs, GENERATION)
    assert isinstance(converted, VisionLanguageModule)
    return converted


def test_the_levels_are_given_and_taken(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule
) -> None:
    model, inputs = model_and_inputs
    first = {name: inputs[name][:16] if name == "pixel_values" else inputs[name][:1] for name in ("pixel_values",)}
    with torch.no_grad():
        out = model.model.get_image_features(first["pixel_values"], inputs["image_grid_thw"][:1])
    levels = levels_of(out)
    assert levels is not None and len(levels) == 2 and levels[0].shape == (4, model.config.text_config.hidden_size)
    names = [deepstack_name(0), deepstack_name(1)]
    assert [s.name for s in module.step.io.inputs if s.name.startswith("deepstack")] == names
    assert set(names) <= {s.name for s in module.vision.io.outputs}
    assert not any(node.op_type == "NonZero" for node in module.step.onnx.graph.node)


def test_greedy_scores_and_beams_equal_transformers(
    model_and_inputs: tuple[Any, dict[str, torch.Tensor]], module: VisionLanguageModule, tmp_path: Path
) -> None:
    model, inputs = model_and_inputs
    expected, expected_scores = greedy_scores(model.generate, inputs, **GREEDY)
    assert len(set(expected[:, inputs["input_ids"].shape[1] :].flatten().tolist())) > 4  # not one token repeated
    tokens, scores = greedy_scores(module.generate, inputs, **GREEDY)
    assert torch.equal(tokens, expected)
    assert float((scores - expected_scores).abs().max()) < 1e-3
    # the model without its deepstack addition decodes otherwise: the test can fail
    text_model = type(model.model.language_model)
    with mock.patch.object(text_model, "_deepstack_process", lambda self, hidden, *_: hidden):
        without, without_scores = greedy_scores(model.generate, inputs, **GREEDY)
    assert not torch.equal(without, expected) or float((without_scores - expected_scores).abs().max()) > 1e-2
    beams = {**GREEDY, "max_new_tokens": 4, "num_beams": 2, "num_return_sequences": 2}
    with torch.no_grad():
        assert torch.equal(module.generate(**inputs, **beams), model.generate(**inputs, **beams))
    saved = module.save(tmp_path / "qwen3-vl")
    served = _two_graphs(saved)  # Triton's request: the prompt and the images, not the levels (the vision graph's)
    assert served is not None and not any(spec.name.startswith("deepstack") for spec in served[1])
    loaded = pipeline.load(saved)
    assert isinstance(loaded, VisionLanguageModule)
    assert torch.equal(loaded.generate(**inputs, **GREEDY), expected)
    # the cache copied through each step, as on a TensorRT engine that runs (no ONNX Runtime buffers bound)
    with mock.patch("pipeline.runtime.generation.vision_feed.bound_runner", return_value=None):
        assert torch.equal(module.generate(**inputs, **GREEDY), expected)


def test_levels_are_placed_by_a_gather_in_masked_order() -> None:
    hidden = torch.zeros(2, 3, 2)
    is_image = torch.tensor([[False, True, True], [True, False, False]])
    levels = [torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]), torch.full((3, 2), 10.0)]
    placed = placed_levels(hidden, is_image, levels)
    assert placed[is_image].tolist() == [[11.0, 11.0], [12.0, 12.0], [13.0, 13.0]]
    assert placed[~is_image].abs().sum() == 0
    assert DeepstackLevels({1: (1,), 0: (0,)}).levels == (0, 1)


def test_levels_added_before_the_first_layer_are_read_from_the_model() -> None:
    """Granite 4 Vision's ``get_image_features`` gives pairs of a decoder layer and a level, and no features for the
    embeddings: the model zeroes its image tokens' embeddings and adds its level before the first layer (its other
    levels' layers are past the small config's two). The probe reads that from the model's forward, and the step's
    hooks give the first layer what the model's own forward gives it. (Its whole decoding is the benchmark's row.)"""
    from pipeline.generation.deepstack import BEFORE_LAYERS, added_after_layers, deepstack_layers
    from pipeline.generation.vision_graph import features_of, image_token_id

    model, (_args, sample) = every.build("granite4_vision", "Granite4VisionForConditionalGeneration")
    vision = {name: sample[name] for name in ("pixel_values", "image_sizes")}
    text = {name: sample[name] for name in ("input_ids", "attention_mask")}
    with torch.no_grad():
        features, levels = features_of(model, vision)
    assert len(levels) == 5 and not features.abs().any()  # levels only: zeros for the embeddings
    is_image = text["input_ids"] == image_token_id(model)
    decoder = model.get_decoder()
    found = deepstack_layers(model, decoder, {**text, **vision}, is_image, levels, zeroed=True)
    assert found == DeepstackLevels({BEFORE_LAYERS: (0,)})
    taken: list[torch.Tensor] = []

    def first_layers_input(call: Any) -> None:  # after the step's hook, which adds the level before the layer
        hook = decoder.layers[0].register_forward_pre_hook(lambda _m, args: taken.append(args[0]))
        try:
            with torch.no_grad():
                call()
        finally:
            hook.remove()

    first_layers_input(lambda: model(**text, **vision))
    embeddings = model.get_input_embeddings()(text["input_ids"]).masked_fill(is_image.unsqueeze(-1), 0.0)
    with added_after_layers(decoder, found, is_image, [levels[0]]):
        first_layers_input(lambda: model(inputs_embeds=embeddings, attention_mask=text["attention_mask"]))
    assert torch.allclose(taken[1], taken[0], atol=1e-5) and taken[0][is_image].abs().any()


def test_tensorrt_rtx_builds_both_graphs(module: VisionLanguageModule) -> None:
    pytest.importorskip("tensorrt_rtx")
    assert module.vision.engine_bytes and module.step.engine_bytes and module.step.report.segments is None
    assert any(spec.name == deepstack_name(1) for spec in module.step.io.inputs)
