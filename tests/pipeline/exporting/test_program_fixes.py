"""Rewrites of the torch.export program before the ONNX translation: 3-d and 5-d scaled_dot_product_attention (which
the exporter refuses: "only 4D query, key, and value are supported", timm's Hiera) and one key/value head broadcast
over the query's heads (Falcon) convert, match PyTorch and build."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from rtx_build import assert_builds
from torch import nn

import pipeline
from pipeline.exporting.program_fixes import fix_program


class Attention(nn.Module):
    """forward(q, k, v, *mask) = fn(q, k, v, *mask)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *mask: torch.Tensor) -> Any:
        return self.fn(q, k, v, *mask)


def _qkv(batch: int = 4) -> tuple[torch.Tensor, ...]:
    return torch.randn(batch, 3, 8), torch.randn(batch, 6, 8), torch.randn(batch, 6, 8)


CASES: dict[str, tuple[Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), _qkv),
    "float-mask-2d-scale": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
        lambda: (*_qkv(), torch.randn(3, 6)),
    ),
    "bool-mask-3d": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        lambda: (*_qkv(), torch.rand(4, 3, 6) > 0.3),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_3d_attention_converts_matches_and_builds(name: str) -> None:
    fn, make = CASES[name]
    model = Attention(fn)
    sample = make()
    if sample[-1].dtype == torch.bool:
        sample[-1][..., 0] = True  # a row with every position masked is NaN in PyTorch
    module = pipeline.convert(model, sample, backend="onnxruntime")
    fresh = tuple(t if t.dtype == torch.bool else torch.randn_like(t) for t in sample)
    torch.testing.assert_close(module(*fresh), model(*fresh), rtol=1e-5, atol=1e-5)
    assert_builds(module)


def test_3d_attention_with_a_dynamic_batch() -> None:
    model = Attention(CASES["causal"][0])
    module = pipeline.convert(
        model, _qkv(4), backend="onnxruntime", dynamic={n: {0: ("batch", 1, 4, 8)} for n in ("q", "k", "v")}
    )
    fresh = _qkv(7)
    torch.testing.assert_close(module(*fresh), model(*fresh), rtol=1e-5, atol=1e-5)


def _qkv5(batch: int = 2) -> tuple[torch.Tensor, ...]:
    return torch.randn(batch, 2, 3, 5, 8), torch.randn(batch, 2, 3, 6, 8), torch.randn(batch, 2, 3, 6, 4)


def test_5d_attention_with_a_5d_mask_is_the_same_program() -> None:
    """The mask (a keyword, of the full rank) is flattened with the inputs (the ONNX path: timm's Hiera below)."""
    model = Attention(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3))
    sample = (*_qkv5(), torch.randn(2, 2, 3, 5, 6))
    program = fix_program(torch.export.export(model, sample))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.unflatten.int in targets
    assert all(len(n.meta["val"].shape) == 4 for n in program.graph.nodes if n.target is F.scaled_dot_product_attention
               or n.target is torch.ops.aten.scaled_dot_product_attention.default)  # fmt: skip
    torch.testing.assert_close(program.module()(*sample), model(*sample), rtol=1e-6, atol=1e-6)


def test_5d_attention_broadcasting_between_inputs_is_left_to_the_exporter() -> None:
    model = Attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))
    q, k = torch.randn(2, 2, 3, 5, 8), torch.randn(1, 2, 3, 6, 8)
    program = torch.export.export(model, (q, k, k))
    before = [str(n.target) for n in program.graph.nodes]
    assert [str(n.target) for n in fix_program(program).graph.nodes] == before


def test_timm_hiera_converts_matches_and_builds() -> None:
    """Hiera's mask-unit attention is 5-d: ``[batch, heads, windows, tokens, head_dim]``."""
    import tests_environment  # noqa: F401 -- torchvision's operator schemas before timm
    from timm.models.hiera import Hiera

    torch.manual_seed(0)
    model = Hiera(img_size=(32, 32), embed_dim=16, num_heads=1, num_classes=0, stages=(1, 1), q_pool=1,
                  mask_unit_size=(4, 4), mask_unit_attn=(True, False), global_pos_size=(8, 8)).eval()  # fmt: skip
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, x)  # validates against PyTorch
    torch.testing.assert_close(module(x), model(x), rtol=1e-5, atol=1e-5)
    assert_builds(module)


def test_4d_attention_is_left_to_the_exporter() -> None:
    model = Attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))
    q = torch.randn(2, 2, 3, 8)
    program = torch.export.export(model, (q, q, q))
    before = [str(n.target) for n in program.graph.nodes]
    assert [str(n.target) for n in fix_program(program).graph.nodes] == before


@pytest.mark.parametrize("opset", [None, 24], ids=["default-opset", "opset-24"])
def test_one_key_value_head_broadcast_over_the_query_heads(opset: int | None) -> None:
    """Multi-query attention written as a broadcast (Falcon): key/value [B, 1, S, D] for a query [B, 4, S, D]. At
    opset 23+ the exporter's translation refused it ("SDPA (MHA) requires q_num_heads = kv_num_heads"); it is one
    ``Attention`` node with one key/value head now, the keys never repeated."""
    model = Attention(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    mask = torch.rand(2, 1, 3, 6) > 0.3
    mask[..., 0] = True
    sample = (torch.randn(2, 4, 3, 8), torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8), mask)
    module = pipeline.convert(model, sample, backend="onnxruntime", opset=opset)
    fresh = (*(torch.randn_like(t) for t in sample[:3]), mask)
    torch.testing.assert_close(module(*fresh), model(*fresh), rtol=1e-5, atol=1e-5)
    ops = [n.op_type for n in module.onnx.graph.node]
    if opset == 24:
        assert ops.count("Attention") == 1 and "Expand" not in ops and "Tile" not in ops
    else:
        assert_builds(module)  # fp32 ONNX Attention has no TensorRT-RTX kernel (README, Generation): default only


class _Stacks(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.hstack([a, b]),
            torch.vstack([a, b]),
            torch.dstack([a, b]),
            torch.column_stack([a, b]),
            torch.atleast_3d(a) * 2,
        )


@pytest.mark.parametrize("shape", [(4,), (2, 3)], ids=["vectors", "matrices"])
def test_stacks_export_without_sequence_ops_match_and_build(shape: tuple[int, ...]) -> None:
    """hstack/vstack/dstack/column_stack/atleast_3d: decomposed before translation, so no sequence op (which
    TensorRT's parser has no importer for) reaches the graph; the same values as PyTorch; the real builder builds."""
    a, b = torch.randn(shape), torch.randn(shape)
    module = pipeline.convert(_Stacks().eval(), (a, b))
    assert not {n.op_type for n in module.onnx.graph.node} & {"SequenceConstruct", "SequenceMap", "ConcatFromSequence"}
    for got, want in zip(module(a, b), _Stacks()(a, b), strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert_builds(module)


class _ScalarScatter(torch.nn.Module):
    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset

    def forward(self, a: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.as_strided_scatter(a, src, (), (), self.offset)


@pytest.mark.parametrize(("shape", "offset"), [((1,), 0), ((3, 4), 7)], ids=["one", "matrix"])
def test_0d_as_strided_scatter_converts_matches_and_builds(shape: tuple[int, ...], offset: int) -> None:
    """A 0-d view (size=[], stride=[]: lists ONNX cannot type) writes the one element at ``offset``, as PyTorch."""
    model = _ScalarScatter(offset).eval()
    module = pipeline.convert(model, (torch.randn(shape), torch.randn(())))
    a, src = torch.randn(shape), torch.randn(())
    torch.testing.assert_close(module(a, src), model(a, src), atol=0, rtol=0)
    assert_builds(module)


class SqueezeAxes(nn.Module):
    """PyTorch's squeeze leaves an axis whose size is not 1; ONNX's Squeeze refuses it (Pixtral squeezes axis 0 of
    its patch features, several of them)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2
        return y.squeeze(0), y.squeeze((0, 1)), y.squeeze(2)


def test_squeeze_of_an_axis_not_of_size_one_converts_matches_and_builds() -> None:
    x = torch.randn(4, 1, 3)
    module = pipeline.convert(SqueezeAxes().eval(), x)
    for ours, theirs in zip(module(x), SqueezeAxes()(x), strict=True):
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs)
    squeezes = [n for n in module.onnx.graph.node if n.op_type == "Squeeze"]
    assert len(squeezes) <= 1  # only axis 1 of the second output is squeezed
    assert_builds(module)


class _BroadcastingCopy(torch.nn.Module):
    """CogVideoX's positional table: ``joint[:, n:].copy_(table)`` with a table of one axis fewer than the slice,
    which PyTorch broadcasts; the exporter's translation of the copy left it unbroadcast (an invalid Transpose)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        joint = x.new_zeros(1, x.shape[1], x.shape[2])
        joint[:, 2:].copy_(torch.sin(x[0, 2:] * 3))
        return x + joint


def test_a_copy_that_broadcasts_its_source_converts_and_matches() -> None:
    model, x = _BroadcastingCopy(), torch.randn(1, 5, 3, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, x)
    other = torch.randn(1, 5, 3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(module(other), model(other))
    assert_builds(module)


class _TwoAutocastRegions(torch.nn.Module):
    """One region autocast cannot touch here (CUDA, tensors on the CPU) and one it changes (bfloat16 on the CPU)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast("cuda", enabled=False):
            inert = x @ x.T
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lowered = x @ x.T
        return inert, lowered


def test_only_autocast_regions_that_change_nothing_are_inlined() -> None:
    from torch._higher_order_ops.wrap import wrap_with_autocast

    from pipeline.exporting.autocast_regions import inline_inert_autocast

    program = torch.export.export(_TwoAutocastRegions(), (torch.randn(3, 3),), strict=False)
    regions = [n for n in program.graph.nodes if n.target is wrap_with_autocast]
    assert [n.args[0] for n in regions] == ["cuda", "cpu"]
    assert inline_inert_autocast(program) == 1
    left = [n for n in program.graph.nodes if n.target is wrap_with_autocast]
    assert [n.args[0] for n in left] == ["cpu"]
    x = torch.randn(3, 3)
    inert, lowered = program.module()(x)
    torch.testing.assert_close(inert, x @ x.T)
    assert lowered.dtype == torch.bfloat16  # the region that changes dtypes still does


class _HintedRepeat(nn.Module):
    """``repeat_interleave`` with its ``output_size`` hint, as Kimi K2.5's tower calls it."""

    def forward(self, x: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(x, repeats, dim=0, output_size=6) * 2


def test_a_repeat_interleave_with_its_output_size_hint_converts_and_matches() -> None:
    """The exporter's translation took no ``output_size`` and failed ("unexpected keyword argument")."""
    model, x = _HintedRepeat(), torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    repeats = torch.tensor([1, 2, 3])
    module = pipeline.convert(model, (x, repeats))
    other = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(module(other, repeats), model(other, repeats))
    assert_builds(module)
