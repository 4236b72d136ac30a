"""Composite functions traced through their static forms (pipeline/export_composites.py): ``cov`` and
``corrcoef`` (whose PyTorch code branches on a tensor's value) and ``combinations`` (whose PyTorch code goes
through ``masked_select``) convert, match PyTorch and build; what has no static form still fails clearly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from rtx_build import assert_builds

import pipeline
from converters.errors import ExportError


class _Call(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> Any:
        return self.fn(*xs)


CASES: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "cov-vector": (torch.cov, (5,)),
    "cov-matrix-correction0": (lambda x: torch.cov(x, correction=0), (3, 6)),
    "cov-method-too-few": (lambda x: x.cov(correction=2), (2, 2)),
    "corrcoef-matrix": (torch.corrcoef, (4, 7)),
    "corrcoef-vector": (lambda x: x.corrcoef(), (6,)),
    "combinations-pairs": (torch.combinations, (5,)),
    "combinations-replacement": (lambda x: torch.combinations(x, r=3, with_replacement=True), (4,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_static_form_converts_matches_and_builds(name: str) -> None:
    fn, shape = CASES[name]
    model = _Call(fn).eval()
    module = pipeline.convert(model, (torch.randn(shape),))
    assert not {n.op_type for n in module.onnx.graph.node} & {"NonZero", "Compress"}
    x = torch.randn(shape)
    torch.testing.assert_close(module(x), model(x), atol=1e-5, rtol=1e-4, equal_nan=True)
    assert_builds(module)


def test_weighted_cov_still_fails_clearly() -> None:
    """Weights make the degrees of freedom a tensor value: no static form, the export error names the op."""
    model = _Call(lambda x, w: torch.cov(x, aweights=w)).eval()
    with pytest.raises(ExportError, match=r"(?s)\[export\].*equal.*fix:"):
        pipeline.convert(model, (torch.randn(2, 5), torch.rand(5) + 0.5))
