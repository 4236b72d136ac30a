"""The vision graph of a tower that drops all-zero padding images by a mask computed from its pixels (Idefics3's
``pixel_values[real_images_inds]``; Idefics2 and SmolVLM share the code): for TensorRT the selection keeps every
image of the sample's row, so the graph has no ``NonZero`` and TensorRT-RTX's real builder builds it as one engine,
with the model's features on ONNX Runtime for every real image. The graph also says whether the model's mask kept
every image of the row and whether it kept none (a row of padding images, which the model drops), and the mask (the
features are one block per image): the runtime's :func:`~pipeline.runtime.generation.kept_images.kept_features`
gives the features, none, or the kept images' blocks (the model's features for a row with padding images).
A tiny random Idefics3 from its config: nothing is downloaded."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import onnxruntime
import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers

import pipeline
from converters import default_registry
from converters.errors import InputError
from converters.registry import ConverterRegistry
from converters.settings import Settings
from pipeline.generation.kept_selections import by_element, kept_selections
from pipeline.generation.vision_graph import convert_vision, image_features
from pipeline.runtime.generation.kept_images import ALL_KEPT, FEATURES, KEPT_ELEMENTS, NONE_KEPT, kept_features

IMAGE = 127
TILES = 2  # images per prompt row (the processor's tiles)
TOKENS = 4 * TILES  # 16 patches of 8x8 per 32x32 tile, merged 2x2 by the connector: 4 tokens per tile


def idefics3() -> Any:
    torch.manual_seed(0)
    vision = transformers.Idefics3VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8
    )
    text = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
    )
    config = transformers.Idefics3Config(
        vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_id=IMAGE, scale_factor=2
    )
    return transformers.Idefics3ForConditionalGeneration(config).eval()


def images(seed: int, rows: int = 2) -> torch.Tensor:
    return torch.randn(rows, TILES, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model() -> Any:
    return idefics3()


def test_a_mask_that_keeps_every_image_is_kept_and_one_that_drops_a_padding_image_is_not(model: Any) -> None:
    real = {"pixel_values": images(1)[:1]}
    (kept,) = kept_selections(lambda: image_features(model, real))
    assert kept.shape == (TILES,)
    padded = real["pixel_values"].clone()
    padded[0, -1] = 0.0  # the row's last image is the processor's padding
    assert kept_selections(lambda: image_features(model, {"pixel_values": padded})) == ()


def test_features_are_by_element_when_dropping_an_element_drops_its_block_alone() -> None:
    rows = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))

    def features(order: Any) -> Any:
        return lambda: order(rows[rows.abs().sum(-1) > 0])

    for order, expected in ((lambda kept: kept * 2, True), (lambda kept: kept.flip(0), False)):
        (selection,) = kept_selections(features(order))
        assert by_element(features(order), selection, features(order)()) is expected


def stages(part: torch.nn.Module, sample: Any, settings: Settings, registry: ConverterRegistry) -> Any:
    """One graph through :func:`pipeline.convert` with ``settings`` (as the vision-language conversion's own)."""
    return pipeline.convert(
        part, sample, converters=registry, **{field.name: getattr(settings, field.name) for field in fields(settings)}
    )


def test_tensorrt_rtx_builds_the_vision_graph_as_one_engine_with_the_models_features(model: Any) -> None:
    """No NonZero, one engine (no segment left to ONNX Runtime), nothing held fixed; the graph's features on ONNX
    Runtime are the model's for the sample's images and for new ones, with the mask said kept whole; a row of padding
    images is said kept by none (the model drops it), a row with one padding image by neither, and its kept image's
    block is the model's features."""
    pytest.importorskip("tensorrt_rtx")
    settings = Settings.from_kwargs({"backend": "tensorrt-rtx", "validate": False})
    vision, fixed = convert_vision(model, {"pixel_values": images(1)}, settings, default_registry(), stages)
    graph = vision.onnx
    assert "NonZero" not in {node.op_type for node in graph.graph.node}
    assert vision.engine_bytes and vision.report.segments is None
    assert fixed == {}
    assert [spec.name for spec in vision.io.outputs] == [FEATURES, ALL_KEPT, NONE_KEPT, KEPT_ELEMENTS]
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    (name,) = (graph_input.name for graph_input in graph.graph.input)
    names = [output.name for output in session.get_outputs()]
    for pixels in (*images(1).split(1), *images(2).split(1)):
        outputs = dict(zip(names, session.run(None, {name: pixels.numpy()}), strict=True))
        with torch.no_grad():
            expected = image_features(model, {"pixel_values": pixels}).numpy()
        np.testing.assert_allclose(outputs[FEATURES], expected, atol=1e-5)
        assert bool(outputs[ALL_KEPT]) and not bool(outputs[NONE_KEPT])
    padded = images(3, rows=1)
    padded[0, -1] = 0.0  # the row's last image is the processor's padding
    outputs = dict(zip(names, session.run(None, {name: padded.numpy()}), strict=True))
    assert outputs[FEATURES].shape == (TOKENS, 32)  # every image's, more than the model's
    assert not bool(outputs[ALL_KEPT]) and not bool(outputs[NONE_KEPT])
    assert outputs[KEPT_ELEMENTS].tolist() == [True, False]
    with torch.no_grad():
        expected = image_features(model, {"pixel_values": padded}).numpy()
    assert len(expected) == TOKENS - 4  # the padding image: the model's features are the real image's alone
    kept = kept_features({key: torch.from_numpy(np.asarray(value)) for key, value in outputs.items()}, 0)
    np.testing.assert_allclose(kept.numpy(), expected, atol=1e-5)
    outputs = dict(zip(names, session.run(None, {name: np.zeros_like(padded.numpy())}), strict=True))
    assert not bool(outputs[ALL_KEPT]) and bool(outputs[NONE_KEPT])
    assert outputs[KEPT_ELEMENTS].tolist() == [False, False]


def test_kept_features_gives_the_features_none_the_kept_blocks_or_refuses_an_image_kept_in_part() -> None:
    features = torch.randn(TOKENS, 32)

    def outputs(all_kept: bool, none_kept: bool) -> dict[str, torch.Tensor]:
        return {FEATURES: features, ALL_KEPT: torch.tensor(all_kept), NONE_KEPT: torch.tensor(none_kept)}

    assert kept_features(outputs(True, False), 0) is features
    assert kept_features(outputs(False, True), 1).shape == (0, 32)
    with pytest.raises(InputError, match="image 2 is kept in part"):
        kept_features(outputs(False, False), 2)
    by_element = {**outputs(False, False), KEPT_ELEMENTS: torch.tensor([False, True])}
    assert torch.equal(kept_features(by_element, 3), features[TOKENS // 2 :])
    assert kept_features({"output": features}, 0) is features  # a graph that selects as the model does
