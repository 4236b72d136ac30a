"""The small built-in converters (amax/amin over every axis, prims::view_of, adaptive_avg_pool3d, cdist with p=0 and
p=inf): converted models match PyTorch on fresh inputs, and the real TensorRT-RTX builder builds their graphs."""

from __future__ import annotations

import math

import pytest
import torch
from rtx_build import assert_builds

import pipeline


class _Call(torch.nn.Module):
    def __init__(self, function: object) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.function(*args)  # type: ignore[operator]


CASES = [
    ("amax of everything", lambda x: torch.amax(x), [(3, 4, 5)]),
    ("amin keepdim", lambda x: torch.amin(x, dim=(0, 2), keepdim=True), [(3, 4, 5)]),
    ("masked amax", lambda x: torch.masked.amax(x, mask=x > 0), [(4, 6)]),
    ("squeeze of several dims", lambda x: torch.squeeze(x, (1, 3)) * 2, [(5, 1, 4, 1)]),
    ("adaptive_avg_pool3d", lambda x: torch.nn.functional.adaptive_avg_pool3d(x, (2, 3, 2)), [(2, 3, 5, 7, 4)]),
    ("adaptive_avg_pool3d unbatched", lambda x: torch.nn.functional.adaptive_avg_pool3d(x, (3, 2, 4)), [(3, 6, 5, 8)]),
    ("cdist p=0", lambda x, y: torch.cdist(torch.round(x), torch.round(y), p=0.0), [(2, 5, 3), (2, 4, 3)]),
    ("cdist p=inf", lambda x, y: torch.cdist(x, y, p=math.inf), [(6, 3), (4, 3)]),
]


@pytest.mark.parametrize(("function", "shapes"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_converts_matches_and_builds(function: object, shapes: list[tuple[int, ...]]) -> None:
    generator = torch.Generator().manual_seed(0)
    sample = tuple(torch.randn(shape, generator=generator) for shape in shapes)
    module = pipeline.convert(_Call(function).eval(), sample)
    fresh = tuple(torch.randn(shape, generator=generator) * 2 for shape in shapes)
    torch.testing.assert_close(module(*fresh), _Call(function)(*fresh), atol=1e-5, rtol=1e-4)
    assert_builds(module)
