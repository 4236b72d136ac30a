"""A sample that passes one tensor (or views of one storage) as two inputs: torch.export traces aliased inputs as
one, so without copies the graph reads one input for both (I2VGenXL's UNet, whose builder passed one tensor as
``sample`` and ``image_latents``, matched only on that sample). Converted, the two inputs stay apart."""

from __future__ import annotations

import torch

import pipeline


class _TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 3, 1)

    def forward(self, sample: torch.Tensor, latents: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([sample, latents * 2], dim=1)) * scale


def test_one_tensor_passed_twice_converts_to_two_inputs() -> None:
    model = _TwoInputs().eval()
    shared = torch.randn(1, 2, 5, 5, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, {"sample": shared, "latents": shared, "scale": torch.ones(1)})
    assert [i.name for i in module.onnx.graph.input] == ["sample", "latents", "scale"]
    other = torch.randn(1, 2, 5, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(module(shared, other, torch.ones(1)), model(shared, other, torch.ones(1)))
