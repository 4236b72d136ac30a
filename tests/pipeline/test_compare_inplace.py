"""Per-layer comparison on a model that changes a module's output in place afterwards (``h += residual``, as
transformers' ResNet does): the module's output is recorded as it was, so no false divergence is reported."""

from __future__ import annotations

import torch
from torch import nn

import pipeline


class InPlaceResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)  # the hook sees this tensor ...
        h += x  # ... which is then changed in place
        return self.head(torch.relu(self.proj(h)))


def test_in_place_residual_gives_no_false_divergence() -> None:
    torch.manual_seed(0)
    model = InPlaceResidual().eval()
    report = pipeline.compare(model, torch.randn(4, 8) * 3, per_layer=True, random_inputs=1)
    assert report.passed
    assert report.layers is not None
    matched = {layer.module for layer in report.layers.layers}
    assert "norm" in matched, matched  # the in-place-modified module was compared, not skipped
    assert report.first_divergence is None
