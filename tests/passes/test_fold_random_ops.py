"""Constant folding leaves random draws alone: a folded draw would make every call return the same sample."""

from __future__ import annotations

import torch
from torch import nn

import pipeline


class FixedShapeNoise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn(64, 64)  # its inputs are all constant: a folding candidate


def test_a_draw_with_constant_inputs_is_not_folded() -> None:
    module = pipeline.convert(FixedShapeNoise().eval(), torch.zeros(64, 64), backend="onnxruntime")
    assert "RandomNormalLike" in {node.op_type for node in module.onnx.graph.node}
    first, second = module(torch.zeros(64, 64)), module(torch.zeros(64, 64))
    assert not torch.equal(first, second)
    assert abs(float(first.std()) - 1.0) < 0.1  # still N(0, 1)
