"""Models returning ``torch.return_types`` namedtuples (``torch.max(x, dim)``, ``topk``, ``var_mean``, ...) convert,
and the converted module returns the same namedtuple class with the same values, before and after save/load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from rtx_build import assert_builds
from torch import nn

import pipeline
from pipeline.runtime import io_spec


class Returns(nn.Module):
    """forward(x) = fn(x)."""

    def __init__(self, fn: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> Any:
        return self.fn(x)


def _max_dim(x: torch.Tensor) -> Any:
    return torch.max(x, 1)


def _min_keepdim(x: torch.Tensor) -> Any:
    return torch.min(x, -1, keepdim=True)


def _topk(x: torch.Tensor) -> Any:
    return torch.topk(x, 3, dim=1)


def _nested(x: torch.Tensor) -> Any:
    return {"best": torch.max(x, 0), "top": (torch.topk(x, 2), x.sum())}


CASES = [_max_dim, _min_keepdim, _topk, _nested]


def assert_same(got: Any, want: Any) -> None:
    """Same containers (the namedtuple class included) at every level and the same tensors."""
    got_leaves, got_tree = pytree.tree_flatten(got)
    want_leaves, want_tree = pytree.tree_flatten(want)
    assert got_tree == want_tree, f"{got_tree} != {want_tree}"
    for g, w in zip(got_leaves, want_leaves, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_namedtuple_results_come_back_as_the_same_namedtuple(fn: Callable[[torch.Tensor], Any]) -> None:
    model = Returns(fn)
    module = pipeline.convert(model, torch.randn(4, 6), backend="onnxruntime")
    x = torch.randn(4, 6)  # fresh input, not the sample
    got, want = module(x), model(x)
    assert_same(got, want)
    if isinstance(want, tuple):
        assert type(got) is type(want)  # e.g. torch.return_types.max
        assert torch.equal(got.indices, want.indices)  # by field name, as a user reads it
    assert_builds(module)


def test_namedtuple_structure_survives_save_and_load(tmp_path: Path) -> None:
    model = Returns(_nested)
    module = pipeline.convert(model, torch.randn(4, 6), backend="onnxruntime")
    loaded = pipeline.load(module.save(tmp_path / "nested"))
    x = torch.randn(4, 6)
    result = loaded(x)
    assert type(result["best"]) is torch.return_types.max
    assert type(result["top"][0]) is torch.return_types.topk
    assert_same(result, model(x))


def test_var_mean_tuple_stays_a_plain_tuple() -> None:
    model = Returns(lambda x: torch.var_mean(x, dim=1))
    module = pipeline.convert(model, torch.randn(3, 5), backend="onnxruntime")
    got = module(torch.randn(3, 5))
    assert type(got) is tuple and len(got) == 2


@pytest.mark.parametrize(
    "result",
    [torch.max(torch.ones(2, 3), 1), [torch.sort(torch.ones(3)), None, ()], {"a": torch.aminmax(torch.ones(3))}],
    ids=["max", "list-with-none-and-empty", "dict-aminmax"],
)
def test_tree_text_round_trip(result: Any) -> None:
    _, tree = pytree.tree_flatten(result)
    text = io_spec.dump_tree(tree)
    assert "torch.return_types." in text
    assert io_spec.load_tree(text) == tree


def test_an_unknown_saved_return_type_is_a_clear_error() -> None:
    _, tree = pytree.tree_flatten(torch.max(torch.ones(2, 3), 1))
    text = io_spec.dump_tree(tree).replace("torch.return_types.max", "torch.return_types.no_such_result")
    with pytest.raises(pipeline.ArtifactError, match="no_such_result"):
        io_spec.load_tree(text)
