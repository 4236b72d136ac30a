"""A model whose traced result holds its fields in another order than its eager one (Mistral 3's image outputs: a
``ModelOutput`` filled in another order under torch.export) converts with every output under its own name: the
graph's outputs are put in the eager call's order, which the module's result structure follows."""

from __future__ import annotations

import torch
from torch import nn

import pipeline


class TracedInAnotherOrder(nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        small, large = x.sum(dim=1), x * 3.0  # [2] and [2, 5]: told apart by shape
        if torch.compiler.is_exporting():
            return {"large": large, "small": small}
        return {"small": small, "large": large}


def test_outputs_take_the_eager_order_and_names() -> None:
    model = TracedInAnotherOrder().eval()
    x = torch.randn(2, 5, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, x, validation_inputs=1)
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in module.onnx.graph.output}
    assert shapes == {"small": [2], "large": [2, 5]}
    got = module(x)
    assert list(got) == ["small", "large"]
    torch.testing.assert_close(got["small"], x.sum(dim=1))
    torch.testing.assert_close(got["large"], x * 3.0)
