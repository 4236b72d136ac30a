"""The converters of ``converters/aten/static.py``: every declared case against PyTorch on ONNX Runtime and built
by the real TensorRT-RTX builder, and the results that do not depend on the values (a 0-d input, ``size=0``)."""

from __future__ import annotations

import pytest
import torch
from converter_cases import assert_case_lowers_matches_and_builds, own_cases
from rtx_build import assert_builds

import pipeline
from converters.aten.static import register_static_converters
from converters.cases import ConverterCase
from converters.registry import ConverterEntry

OWN, REGISTRY, CASES = own_cases(register_static_converters)


@pytest.mark.parametrize(("entry", "case"), CASES, ids=[c.name for _, c in CASES])
def test_case_matches_pytorch_and_builds(entry: ConverterEntry, case: ConverterCase) -> None:
    assert_case_lowers_matches_and_builds(entry, case, REGISTRY, OWN)


class _Nonzero(torch.nn.Module):
    def __init__(self, size: int, fill_value: int) -> None:
        super().__init__()
        self.size, self.fill_value = size, fill_value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero_static(x, size=self.size, fill_value=self.fill_value)


@pytest.mark.parametrize(
    ("shape", "size", "fill"),
    [((), 0, -1), ((), 3, -1), ((3, 2), 0, 5)],
    ids=["0d-size0", "0d-size3", "size0"],
)
def test_nonzero_static_without_values(shape: tuple[int, ...], size: int, fill: int) -> None:
    model = _Nonzero(size, fill).eval()
    x = torch.zeros(shape)
    module = pipeline.convert(model, (x,), converters=REGISTRY)
    for value in (x, torch.ones(shape)):
        expected = model(value)
        got = module(value)
        assert got.shape == expected.shape == (size, len(shape))
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert_builds(module)


def test_nonzero_static_exact_counts() -> None:
    """Exactly ``size`` set elements, fewer and more: the padding starts where PyTorch's does."""
    model = _Nonzero(4, -2).eval()
    module = pipeline.convert(model, (torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]]),), converters=REGISTRY)
    for values in ([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]], [[0.0, 0.0, 0.0], [0.0, 0.0, 5.0]], [[1.0] * 3] * 2):
        x = torch.tensor(values)
        torch.testing.assert_close(module(x), model(x), rtol=0, atol=0)
