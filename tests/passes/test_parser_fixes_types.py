"""Parser fixes of issue 14's build stage: edge ``Pad`` with a negative pad (ONNX Runtime refuses to edge-pad an
extent the crop emptied) as constant-index ``Gather``s. Each: the op sequence, the numbers against PyTorch on ONNX
Runtime, ``onnx.checker`` and the real TensorRT-RTX build."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
import torch.nn.functional as F
from rtx_build import assert_builds
from torch import nn

import pipeline
from passes.parser_fixes.edge_pad import NegativeEdgePadToGather, edge_indices
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
