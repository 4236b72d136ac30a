"""Constants the exporter's optimizer leaves unregistered (onnxscript 0.7.2's Clip(Clip(x)) fusion on chains sharing
``x``): registered again before any pass, so timm's Gemma4 ViT converts, matches PyTorch and builds; a read of a
tensor that holds no data is an ExportError naming the exporter, the node and the tensor."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from rtx_build import assert_builds

import pipeline
from converters.errors import ExportError
from pipeline.exporting.program_weights import restore_lost_initializers


def _model_reading(lost: ir.Value) -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    clip = ir.Node("", "Clip", [x, lost], name="clip")
    graph = ir.Graph([x], clip.outputs, nodes=[clip], opset_imports={"": 18})
    return ir.Model(graph, ir_version=10)


def test_a_lost_constant_is_registered() -> None:
    lost = ir.Value(name="x_min_1", const_value=ir.tensor(np.array(-1.0, np.float32)))
    model = _model_reading(lost)
    restore_lost_initializers(model)
    assert model.graph.initializers["x_min_1"] is lost


def test_a_lost_tensor_without_data_names_the_exporter() -> None:
    model = _model_reading(ir.Value(name="x_min_1"))
    with pytest.raises(ExportError, match=r"torch.onnx.export wrote a graph .*'x_min_1' read by 'clip'"):
        restore_lost_initializers(model)


def test_timm_gemma4_vit_converts_matches_and_builds() -> None:
    """Each projection clamps its input between buffers: query, key and value share theirs (the colliding chains)."""
    import tests_environment  # noqa: F401 -- torchvision's operator schemas before timm
    import timm

    torch.manual_seed(0)
    model = timm.create_model("gemma4_vit_167m", pretrained=False, embed_dim=32, depth=1, num_heads=2, head_dim=16,
                              intermediate_size=64, num_classes=0, img_size=32).eval()  # fmt: skip
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, x)  # validates against PyTorch
    torch.testing.assert_close(module(x), model(x), rtol=1e-5, atol=1e-5)
    assert_builds(module)
