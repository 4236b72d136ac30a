"""Accuracy-driven un-quantization (pipeline/quantize/search.py): a model whose one layer cannot take per-tensor
INT8 activations (an outlier channel 1000x the others) misses the error bound fully quantized; the search returns
that layer, and only it, to the higher type, and the report says which and the quantized FLOP share after."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pipeline


class OutlierMLP(nn.Module):
    """a -> relu -> b -> relu -> c, where b's first output channel is 1000x the others and c reads it 1000x weaker:
    the float function is ordinary, but c's input quantized per tensor loses every channel but the outlier."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 8)
        with torch.no_grad():
            self.b.weight[0] *= 1000.0
            self.b.bias[0] = 1000.0
            self.c.weight[:, 0] /= 1000.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def samples(count: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(32, 16, generator=generator) for _ in range(count)]


def test_the_most_sensitive_layer_returns_to_fp32_until_the_error_bound_holds() -> None:
    model = OutlierMLP().eval()
    module = pipeline.convert(
        model, samples(1, 0)[0], precision="int8", quantize_fallback="fp32", calibration=samples(4, 1)
    )
    report = module.report.quantization
    assert report is not None
    searched = [s for s in report.skipped if s.reason.startswith("accuracy search")]
    assert len(report.unquantized) == 1 and [s.node for s in searched] == list(report.unquantized)
    # the one left out is the layer reading the outlier channel: c, the last Gemm (a and b stay 8-bit)
    gemms = [n.name for n in module.onnx.graph.node if n.op_type in ("Gemm", "MatMul")]
    assert report.unquantized == (gemms[-1],)
    assert {op.node for op in report.quantized} == set(gemms[:-1])
    assert report.relative_error <= report.error_bound
    assert any(note.startswith("accuracy search: relative error") for note in report.notes)
    assert 0.5 < report.share < 1.0  # c is the smallest of the three; its FLOPs are the share lost
    assert module.report.accuracy is not None and module.report.accuracy.passed
    with torch.no_grad():
        x = samples(1, 7)[0]
        error = (module(x) - model(x)).norm() / model(x).norm()
    assert float(error) < report.error_bound


def test_without_the_search_the_missed_bound_is_a_loud_warning(caplog: pytest.LogCaptureFixture) -> None:
    module = pipeline.convert(
        OutlierMLP().eval(),
        samples(1, 0)[0],
        precision="int8",
        quantize_fallback="fp32",
        calibration=samples(4, 1),
        precision_search=False,
    )
    report = module.report.quantization
    assert report is not None and not report.unquantized and report.share == 1.0
    assert report.relative_error > 10 * report.error_bound  # c's input keeps only the outlier channel
    assert any("exceeds the quantization bound" in w for w in report.warnings)
    assert any("exceeds the quantization bound" in r.getMessage() for r in caplog.records)
