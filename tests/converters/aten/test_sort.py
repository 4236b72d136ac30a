"""``aten::sort`` (``sort``, ``argsort``, ``msort``): the rank sort is PyTorch's stable order on ties and NaN and
builds past TensorRT-RTX's TopK limit; ``TopK`` stays where neither matters. PyTorch against ONNX Runtime through
``pipeline.convert``, and the real TensorRT-RTX build."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from rtx_build import assert_builds
from torch import nn

import pipeline
from converters.aten.sort import MAX_RANK_PAIRS, STABLE_IN_PRACTICE, TOPK_MAX, sort_method


class Op(nn.Module):
    """forward(x) = fn(x)."""

    def __init__(self, fn: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> Any:
        return self.fn(x)


def _tied(*shape: int) -> torch.Tensor:
    """Values from {0, 1, 2, NaN}: many ties, and NaN (last ascending, first descending in PyTorch)."""
    x = torch.randint(0, 4, shape).float()
    return torch.where(x == 3, torch.nan, x)


def _same(got: Any, want: Any) -> bool:
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    return all(torch.equal(g.nan_to_num(99.0), w.nan_to_num(99.0)) for g, w in zip(got, want, strict=True))


CASES: dict[str, tuple[Callable[[torch.Tensor], Any], tuple[int, ...]]] = {
    "stable-ascending": (lambda x: tuple(torch.sort(x, dim=1, stable=True)), (3, 40)),
    "stable-descending-dim0": (lambda x: tuple(torch.sort(x, dim=0, descending=True, stable=True)), (30, 4)),
    "default-short-axis": (lambda x: tuple(torch.sort(x, dim=0)), (12, 5)),
    "argsort-short-axis": (lambda x: torch.argsort(x, descending=True), (4, 16)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sort_is_pytorchs_order_on_ties_and_nan_and_builds(name: str) -> None:
    fn, shape = CASES[name]
    model = Op(fn)
    module = pipeline.convert(model, (_tied(*shape),), backend="onnxruntime")
    fresh = _tied(*shape)
    assert _same(module(fresh), model(fresh))
    assert "TopK" not in {n.op_type for n in module.onnx.graph.node}
    assert_builds(module)


def test_msort_past_the_topk_limit_builds() -> None:
    """8000 values with ties and NaN: TensorRT-RTX refuses TopK with k > 3840; chunked TopK merged by binary search
    builds and sorts exactly."""
    model = Op(torch.msort)
    module = pipeline.convert(model, (torch.randn(8000) * 100.0,), backend="onnxruntime")
    fresh = _tied(8000)
    assert _same(module(fresh), model(fresh))
    assert_builds(module)


@pytest.mark.parametrize("descending", [False, True])
def test_long_sort_indices_are_exact_without_ties(descending: bool) -> None:
    model = Op(lambda x: tuple(torch.sort(x, dim=0, descending=descending)))
    module = pipeline.convert(model, (torch.randn(9000, 2),), backend="onnxruntime", validate=False)
    fresh = torch.stack([torch.randperm(9000).float() for _ in range(2)], dim=1)
    fresh[5, 0] = fresh[7000, 1] = torch.nan
    assert _same(module(fresh), model(fresh))


def test_topk_stays_where_pytorchs_tie_order_is_no_rule() -> None:
    model = Op(lambda x: torch.sort(x, dim=-1)[0])
    module = pipeline.convert(model, (_tied(3, 100),), backend="onnxruntime")
    assert [n.op_type for n in module.onnx.graph.node if n.op_type == "TopK"] == ["TopK"]
    fresh = _tied(3, 100)
    assert _same(module(fresh), model(fresh))


def test_which_sorts_take_which_construction() -> None:
    assert sort_method(STABLE_IN_PRACTICE, 1, stable=False) == "ranks"
    assert sort_method(STABLE_IN_PRACTICE + 1, 1, stable=False) == "topk"
    assert sort_method(100, 4, stable=True) == "ranks"
    assert sort_method(TOPK_MAX + 1, 1, stable=False) == "chunks"
    assert sort_method(TOPK_MAX + 1, MAX_RANK_PAIRS, stable=True) == "chunks"
    assert sort_method("n", 1, stable=True) == "topk"


def test_half_precision_keeps_topk() -> None:
    """fp16 picks each node's type on its own: the rank and chunk sorts' comparisons could disagree; TopK stays."""
    model = Op(lambda x: tuple(torch.sort(x, dim=0, stable=True)))
    module = pipeline.convert(model, (_tied(12, 3),), backend="onnxruntime", precision="fp16", validate=False)
    assert "TopK" in {n.op_type for n in module.onnx.graph.node}
    values, indices = module(_tied(12, 3))
    assert torch.equal(torch.sort(indices, dim=0)[0], torch.arange(12).unsqueeze(1).expand(12, 3))
