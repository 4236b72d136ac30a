"""A constant the exporter folds from the model's parameters is the value PyTorch computes (pipeline.exporting's
torch constant folding): Mistral Large 4's rotary frequencies ``inv_freq * alpha.exp()``."""

from __future__ import annotations

import torch

import pipeline


class ScaledFrequencies(torch.nn.Module):
    """Positions times frequencies computed from a parameter at run time (numpy's exp(1.0) is not PyTorch's)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
        self.alpha = torch.nn.Parameter(torch.ones(32))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return positions[..., None].float() * (self.inv_freq * self.alpha.exp())


def test_folded_parameter_computation_is_pytorchs_value() -> None:
    model = ScaledFrequencies().eval()
    positions = torch.arange(16, dtype=torch.int64)[None].repeat(2, 1)
    module = pipeline.convert(model, (positions,))
    with torch.no_grad():
        expected = model(positions)
    # each element is one float32 product of the same two numbers: equal bit for bit, or a constant is not PyTorch's
    assert torch.equal(module(positions), expected)
