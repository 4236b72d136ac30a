"""The exporter's optimizer removes ``x + 0`` only when the constant is exactly 0: an RMSNorm with ``eps=1e-8``
(transformers' Helium) keeps its epsilon, so a zero row normalises to 0 (not NaN) and the graph matches PyTorch
float32 within float32's own error; transformers' Helium converts in fp32 under the fixed tolerance."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from model_sources import transformers_models
from torch import nn

import pipeline


class RMSNorm(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _add_constants(model: onnx.ModelProto) -> list[float]:
    values = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            values[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t)
    return [
        float(values[i])
        for n in model.graph.node
        if n.op_type == "Add"
        for i in n.input
        if i in values and values[i].size == 1
    ]


def test_a_tiny_epsilon_survives_the_exporters_optimizer_and_a_zero_row_stays_zero() -> None:
    model = RMSNorm(1e-8).eval()
    x = torch.randn(3, 16) * 1e-3
    x[1] = 0
    module = pipeline.convert(model, x)
    assert any(abs(v - 1e-8) < 1e-12 for v in _add_constants(module.onnx)), _add_constants(module.onnx)
    got = module(x).numpy()
    assert np.isfinite(got).all() and not got[1].any()
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_an_exact_zero_is_still_removed() -> None:
    class AddZero(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) + torch.zeros(())

    module = pipeline.convert(AddZero().eval(), torch.randn(2, 4))
    assert "Add" not in {n.op_type for n in module.onnx.graph.node}


def test_helium_matches_pytorch_float32() -> None:
    model, sample = transformers_models.build("helium")
    assert model.config.rms_norm_eps == 1e-8
    module = pipeline.convert(model, sample)
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.passed
    assert all(o.max_abs < 1e-5 for o in accuracy.outputs), [(o.name, o.max_abs) for o in accuracy.outputs]
