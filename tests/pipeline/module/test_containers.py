"""Models returning diffusers' ``BaseOutput``, plain dataclasses and namedtuples convert, and the converted module
returns the same type with the same values, before and after save/load; an unknown container is an ExportError
naming it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
import torch.utils._pytree as pytree
from diffusers.utils import BaseOutput
from torch import nn

import pipeline
from pipeline.runtime.containers import dumps, loads


@dataclasses.dataclass
class DenoiserOutput(BaseOutput):
    """Like diffusers' UNet2DConditionOutput: registered with pytree but without a flatten_with_keys_fn."""

    sample: torch.Tensor
    extra: torch.Tensor | None = None


@dataclasses.dataclass
class Plain:
    """A dataclass nobody registered with torch's pytree."""

    image: torch.Tensor
    latents: torch.Tensor | None
    scale: torch.Tensor


class Pair(NamedTuple):
    """A user namedtuple (torch's pytree cannot save it by itself)."""

    low: torch.Tensor
    high: torch.Tensor


class Opaque:
    """A container torch's pytree does not know."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x


class Denoiser(nn.Module):
    """forward(sample) like a diffusers denoiser: the input and the output are both called 'sample'."""

    def forward(self, sample: torch.Tensor, return_dict: bool = True) -> Any:
        out = torch.tanh(sample) * 2
        return DenoiserOutput(sample=out) if return_dict else (out,)


class Returns(nn.Module):
    """forward(x) = make(x)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Any:
        if self.kind == "dataclass":
            return {"out": Plain(image=x + 1, latents=None, scale=x.sum().reshape(1))}
        if self.kind == "namedtuple":
            return [Pair(low=x.min(0).values, high=x.max(0).values)]
        return Opaque(x * 2)


def _same(got: Any, want: Any) -> None:
    got_leaves, got_tree = pytree.tree_flatten(got)
    want_leaves, want_tree = pytree.tree_flatten(want)
    assert got_tree == want_tree, f"{got_tree} != {want_tree}"
    for g, w in zip(got_leaves, want_leaves, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_a_diffusers_output_comes_back_as_its_own_type(tmp_path: Path) -> None:
    model = Denoiser()
    module = pipeline.convert(model, torch.randn(2, 3))
    assert [t.name for t in module.io.outputs] == ["sample_out"]  # the input is 'sample' already
    x = torch.randn(2, 3)
    got = module(x)
    assert type(got) is DenoiserOutput and got.extra is None
    torch.testing.assert_close(got.sample, model(x).sample)
    loaded = pipeline.load(module.save(tmp_path / "denoiser"))
    assert type(loaded(x)) is DenoiserOutput
    _same(loaded(x), model(x))


def test_return_dict_false_gives_the_tuple() -> None:
    model = Denoiser()
    module = pipeline.convert(model, ((torch.randn(2, 3),), {"return_dict": False}))
    x = torch.randn(2, 3)
    got = module(x, return_dict=False)
    assert type(got) is tuple
    _same(got, model(x, return_dict=False))


@pytest.mark.parametrize("kind", ["dataclass", "namedtuple"])
def test_dataclasses_and_namedtuples_survive_save_and_load(kind: str, tmp_path: Path) -> None:
    model = Returns(kind)
    module = pipeline.convert(model, torch.randn(4, 3))
    loaded = pipeline.load(module.save(tmp_path / kind))
    x = torch.randn(4, 3)
    for got in (module(x), loaded(x)):
        _same(got, model(x))
    if kind == "dataclass":
        assert type(loaded(x)["out"]) is Plain and loaded(x)["out"].latents is None
    else:
        assert type(loaded(x)[0]) is Pair
        torch.testing.assert_close(loaded(x)[0].high, x.max(0).values)


def test_an_unknown_container_is_an_error_naming_it() -> None:
    with pytest.raises(pipeline.ExportError, match=r"(?s)Opaque.*register_pytree_node\(Opaque"):
        pipeline.convert(Returns("opaque"), torch.randn(4, 3))


def test_a_class_that_cannot_be_imported_is_an_artifact_error() -> None:
    _, tree = pytree.tree_flatten(Pair(torch.ones(1), torch.ones(1)))
    text = dumps(tree).replace("test_containers:Pair", "test_containers:Gone")
    with pytest.raises(pipeline.ArtifactError, match="Gone.*cannot be imported"):
        loads(text)
