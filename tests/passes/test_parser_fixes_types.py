"""Parser fixes of issue 14's build stage: edge ``Pad`` with a negative pad (ONNX Runtime refuses to edge-pad an
extent the crop emptied) as constant-index ``Gather``s; a UInt8 constant graph output (TensorRT takes no UInt8
constant) as a ``Cast`` of an int32 one. Each: the op sequence, the numbers against PyTorch on ONNX
Runtime, ``onnx.checker`` and the real TensorRT-RTX build."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from rtx_build import assert_builds
from torch import nn

import pipeline
from converters.settings import Settings
from passes.base import PassManager
from passes.folding.fold import FoldConstants
from passes.parser_fixes.edge_pad import NegativeEdgePadToGather, edge_indices
from passes.parser_fixes.uint8_constants import UInt8ConstantOutputsAsCasts
from passes.rules import explain


class Replicate(nn.Module):
    """``F.pad(x, pads, mode="replicate")``."""

    def __init__(self, pads: tuple[int, ...]) -> None:
        super().__init__()
        self.pads = pads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, self.pads, mode="replicate")


@pytest.mark.parametrize(
    ("pads", "shape"),
    [((-4, 5, 0, 0), (5, 3, 4, 4)), ((-1, 2, 3, -2), (2, 3, 5, 6)), ((1, -2, 2, 2, -1, 1), (1, 2, 3, 4, 5))],
    ids=["crop-everything-then-pad", "two-axes", "three-axes"],
)
def test_negative_replicate_pad_matches_pytorch_and_builds(pads: tuple[int, ...], shape: tuple[int, ...]) -> None:
    model = Replicate(pads)
    module = pipeline.convert(model, (torch.randn(*shape),), backend="onnxruntime")
    assert {n.op_type for n in module.onnx.graph.node} == {"Gather"}
    onnx.checker.check_model(module.onnx, full_check=True)
    fresh = torch.randn(*shape)
    assert torch.equal(module(fresh), model(fresh))
    assert_builds(module)


def test_edge_indices_read_the_original_extent() -> None:
    assert edge_indices(4, -4, 5).tolist() == [3, 3, 3, 3, 3]
    assert edge_indices(3, 2, -1).tolist() == [0, 0, 0, 1]


def test_the_rule_leaves_non_negative_and_constant_pads() -> None:
    x = gs.Variable("x", dtype=np.float32, shape=[2, 4])
    y = gs.Variable("y", dtype=np.float32)
    pads = gs.Constant("pads", np.array([0, 1, 0, 2], np.int64))
    edge = gs.Node("Pad", name="edge", attrs={"mode": "edge"}, inputs=[x, pads], outputs=[y])
    graph = gs.Graph(nodes=[edge], inputs=[x], outputs=[y], opset=18)
    assert "no negative pad" in explain(NegativeEdgePadToGather(), graph, "edge")
    edge.attrs["mode"] = "constant"
    assert "not 'edge'" in explain(NegativeEdgePadToGather(), graph, "edge")


class BatchNormWithUpdate(nn.Module):
    """``aten._batch_norm_with_update``: output, saved mean and 1/std, and the empty uint8 ``reserve``."""

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mean, var = torch.zeros(x.shape[1]), torch.ones(x.shape[1])
        return tuple(torch.ops.aten._batch_norm_with_update(x, w, b, mean, var, 0.5, 0.6))


def test_uint8_constant_output_is_a_cast_and_builds() -> None:
    """The empty uint8 ``reserve`` output: a Cast of an int32 constant (TensorRT takes no UInt8 constant)."""
    model = BatchNormWithUpdate()
    sample = (torch.randn(5, 5, 5), torch.randn(5), torch.randn(5))
    module = pipeline.convert(model, sample, backend="onnxruntime")
    reserve = module.onnx.graph.output[3]
    producer = next(n for n in module.onnx.graph.node if reserve.name in n.output)
    assert producer.op_type == "Cast" and reserve.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    onnx.checker.check_model(module.onnx, full_check=True)
    fresh = (torch.randn(5, 5, 5), torch.randn(5), torch.randn(5))
    got, want = module(*fresh), model(*fresh)
    assert got[3].dtype == torch.uint8 and got[3].shape == want[3].shape == (0,)
    for g, w in zip(got[:3], want[:3], strict=True):
        torch.testing.assert_close(g, w)
    assert_builds(module)


def test_uint8_constant_outputs_pass_keeps_values_and_folding_keeps_the_cast() -> None:
    x = gs.Variable("x", dtype=np.float32, shape=[2])
    y = gs.Variable("y", dtype=np.float32, shape=[2])
    codes = gs.Constant("codes", np.array([0, 7, 255], np.uint8))
    graph = gs.Graph(nodes=[gs.Node("Relu", inputs=[x], outputs=[y])], inputs=[x], outputs=[y, codes], opset=18)
    result = UInt8ConstantOutputsAsCasts()(graph, Settings())
    assert result.modified
    graph, _ = PassManager((UInt8ConstantOutputsAsCasts(), FoldConstants()), max_iterations=3).run(graph, Settings())
    model = gs.export_onnx(graph)
    assert [n.op_type for n in model.graph.node] == ["Relu", "Cast"]
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _, got = session.run(None, {"x": np.array([-1.0, 2.0], np.float32)})
    assert got.dtype == np.uint8 and got.tolist() == [0, 7, 255]
