"""The converters of ``converters/aten_static.py``: every declared case against PyTorch on ONNX Runtime and built
by the real TensorRT-RTX builder, and the results that do not depend on the values (a 0-d input, ``size=0``)."""

from __future__ import annotations

import pytest
import torch
from rtx_build import assert_builds

import pipeline
from converters.aten_static import register_static_converters
from converters.cases import ConverterCase, collect_cases
from converters.defaults import default_registry
from converters.registry import ConverterEntry, ConverterRegistry
from converters.targets import node_key

OWN = ConverterRegistry()
register_static_converters(OWN)
REGISTRY = default_registry()
REGISTRY.include(OWN)
CASES = list({(e.function, c.name): (e, c) for e, c in collect_cases(OWN)}.values())


def _random(shape: tuple[int, ...], dtype: str, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(getattr(torch, dtype))


@pytest.mark.parametrize(("entry", "case"), CASES, ids=[c.name for _, c in CASES])
def test_case_matches_pytorch_and_builds(entry: ConverterEntry, case: ConverterCase) -> None:
    generator = torch.Generator().manual_seed(0)
    model = case.module().eval()
    sample = tuple(_random(shape, dtype, generator) for shape, dtype in case.inputs)
    module = pipeline.convert(model, sample, converters=REGISTRY, dynamic=case.dynamic, tolerances=case.tolerances)
    opaque = [n.name for n in module.onnx.graph.node if node_key(n.domain, n.op_type) in set(OWN.op_keys())]
    assert opaque == []
    fresh = tuple(_random(shape, dtype, generator) for shape, dtype in case.inputs)
    with torch.no_grad():
        torch.testing.assert_close(module(*fresh), model(*fresh), rtol=0, atol=0)
    assert_builds(module)


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
