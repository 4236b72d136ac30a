"""Built-in converters for ATen ops outside pointwise math that the exporter has no ONNX translation for.

``register_aten2_converters`` is the one list of them (linear algebra lives in ``converters/aten/linalg.py`` and
``converters/aten/lu.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.aten.linalg import register_linalg_converters
from converters.aten.lu import register_lu_converters
from converters.aten.numeric.linalg_steps import axes, const, scalar
from converters.aten.qr import register_qr_converters
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from converters.settings import Settings

_REDUCTIONS = ("prod", "mean", "amax", "amin")


def _rank(tensor: gs.Tensor | None) -> int | None:
    return None if tensor is None or tensor.shape is None else len(tensor.shape)


def index_reducible(node: gs.Node, settings: Settings) -> bool:
    """``index_reduce`` on a floating ``self`` of known rank with a 1-D index of static length and a known
    reduction."""
    values, index = node.inputs[0], node.inputs[1]
    floating = values.dtype is not None and np.issubdtype(np.dtype(values.dtype), np.floating)
    static_index = index.shape is not None and len(index.shape) == 1 and isinstance(index.shape[0], int)
    return floating and static_index and _rank(values) is not None and str(node.attrs.get("reduce")) in _REDUCTIONS


class _IndexReduce(torch.nn.Module):
    def __init__(self, dim: int, reduce: str, include_self: bool) -> None:
        super().__init__()
        self.dim, self.reduce, self.include_self = dim, reduce, include_self

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        index = (b.abs() * 3).long().clamp(max=a.shape[self.dim] - 1).flatten()[: c.shape[self.dim]]
        return a.index_reduce(self.dim, index, c, self.reduce, include_self=self.include_self)


@converter_case(
    lambda: _IndexReduce(0, "amax", True), inputs=[((5, 3), "float32"), ((4,), "float32"), ((4, 3), "float32")]
)
@converter_case(
    lambda: _IndexReduce(1, "amin", False), inputs=[((2, 5, 3), "float32"), ((6,), "float32"), ((2, 6, 3), "float32")]
)
@converter_case(
    lambda: _IndexReduce(-1, "prod", True), inputs=[((3, 4), "float32"), ((5,), "float32"), ((3, 5), "float32")]
)
@converter_case(
    lambda: _IndexReduce(0, "prod", False), inputs=[((4, 2), "float32"), ((6,), "float32"), ((6, 2), "float32")]
)
@converter_case(
    lambda: _IndexReduce(0, "mean", True), inputs=[((5, 3), "float32"), ((7,), "float32"), ((7, 3), "float32")]
)
@converter_case(
    lambda: _IndexReduce(1, "mean", False), inputs=[((2, 4), "float32"), ((6,), "float32"), ((2, 6), "float32")]
)
def convert_index_reduce(ctx: ConverterContext) -> gs.Tensor:
    """``aten::index_reduce``: ``self[index[j]] (reduce)= source[j]`` along ``dim``, without a scatter: a
    ``(..., n, k)`` mask ``index[j] == i`` selects, for every row ``i`` of ``self``, the source rows reduced
    into it (``Where`` + ``ReduceMax/Min/Prod/Sum``). Rows no index hits keep ``self``; ``include_self=False``
    leaves ``self`` out of the rows it hits. Same reductions as PyTorch; a sum in another order for ``mean``."""
    values, index, source = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    rank = _rank(values) or 0
    if rank == 0:
        values, source = (ctx.op.Unsqueeze(t, axes(ctx, 0)) for t in (values, source))
    rank = max(rank, 1)
    dim = int(ctx.attrs["dim"]) % rank
    perm = [*(i for i in range(rank) if i != dim), dim]
    inverse = [perm.index(i) for i in range(rank)]
    moved, moved_source = (ctx.op.Transpose(t, perm=perm) for t in (values, source))
    n = _last_length(ctx, moved)
    rows = ctx.op.Unsqueeze(
        ctx.op.Range(const(ctx, np.array(0, np.int64)), n, const(ctx, np.array(1, np.int64))),
        axes(ctx, -1),
    )
    hits = ctx.op.Equal(rows, ctx.op.Unsqueeze(index, axes(ctx, 0)))  # (n, k)
    result = _reduce_rows(ctx, moved, ctx.op.Unsqueeze(moved_source, axes(ctx, -2)), hits)
    result = ctx.op.Transpose(result, perm=inverse)
    return ctx.op.Squeeze(result, axes(ctx, 0)) if _rank(ctx.inputs[0]) == 0 else result


def _reduce_rows(ctx: ConverterContext, values: gs.Tensor, source: gs.Tensor, hits: gs.Tensor) -> gs.Tensor:
    """``values`` (``(..., n)``) with the rows of ``source`` (``(..., 1, k)``) selected by ``hits`` (``(n, k)``)
    reduced into each of its ``n`` entries."""
    reduce, include_self = str(ctx.attrs["reduce"]), bool(ctx.attrs["include_self"])
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    last = axes(ctx, -1)
    hit_any = ctx.op.Cast(ctx.op.ReduceMax(ctx.op.Cast(hits, to=6), last, keepdims=0), to=9)  # (n,) bool
    if reduce == "mean":
        total = ctx.op.ReduceSum(ctx.op.Where(hits, source, scalar(ctx, 0.0, dtype)), last, keepdims=0)
        count = ctx.op.ReduceSum(ctx.op.Cast(hits, to=_float_type(dtype)), last, keepdims=0)
        if include_self:
            return ctx.op.Div(ctx.op.Add(values, total), ctx.op.Add(count, scalar(ctx, 1.0, dtype)))
        return ctx.op.Where(hit_any, ctx.op.Div(total, count), values)
    neutral = {"prod": 1.0, "amax": float("-inf"), "amin": float("inf")}[reduce]
    reducer = {"prod": ctx.op.ReduceProd, "amax": ctx.op.ReduceMax, "amin": ctx.op.ReduceMin}[reduce]
    reduced = reducer(ctx.op.Where(hits, source, scalar(ctx, neutral, dtype)), last, keepdims=0)
    if include_self:
        combine = {"prod": ctx.op.Mul, "amax": ctx.op.Max, "amin": ctx.op.Min}[reduce]
        reduced = combine(values, reduced)
    return ctx.op.Where(hit_any, reduced, values)


# ---------------------------------------------------------------------------------------------- searching


def searchable(node: gs.Node, settings: Settings) -> bool:
    """``searchsorted`` with inputs of known rank: a 1-D sequence, or one with the values' batch dimensions."""
    sequence, values = _rank(node.inputs[0]), _rank(node.inputs[1])
    return sequence is not None and values is not None and (sequence == 1 or sequence == values)


class _SearchSorted(torch.nn.Module):
    def __init__(self, right: bool, sort: bool = True) -> None:
        super().__init__()
        self.right, self.sort = right, sort

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not self.sort:
            return torch.searchsorted(a, b, right=self.right, sorter=torch.argsort(a))
        return torch.searchsorted(torch.sort(a).values, b, right=self.right)


@converter_case(lambda: _SearchSorted(right=False), inputs=[((8,), "float32"), ((3, 5), "float32")])
@converter_case(lambda: _SearchSorted(right=True), inputs=[((2, 6), "float32"), ((2, 4), "float32")])
@converter_case(lambda: _SearchSorted(right=False, sort=False), inputs=[((7,), "float32"), ((9,), "float32")])
@converter_case(lambda: _SearchSorted(right=True), inputs=[((6,), "int64"), ((5,), "float32")])
def convert_searchsorted(ctx: ConverterContext) -> gs.Tensor:
    """``aten::searchsorted.Tensor``: the insertion index of each value = how many boundaries lie below it
    (``<=`` for ``right``/``side="right"``), counted over a ``(..., M, B)`` comparison like ``bucketize``; a
    ``sorter`` first gathers the sequence into sorted order. A sequence and values of different types (integer
    counts searched for float offsets: MusicFlamingo's windows) are compared in their common type, as torch compares
    them (an ONNX comparison takes one type)."""
    sequence, values = ctx.inputs[0], ctx.inputs[1]
    kinds = [np.dtype(kind) for kind in ctx.input_dtypes[:2] if kind is not None]
    if len(kinds) == 2 and kinds[0] != kinds[1]:
        floating = [kind for kind in kinds if np.issubdtype(kind, np.floating)]
        common = floating[0] if len(floating) == 1 else np.promote_types(kinds[0], kinds[1])
        to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(common))
        sequence, values = ctx.op.Cast(sequence, to=to), ctx.op.Cast(values, to=to)
    sorter = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    if sorter is not None:
        sequence = ctx.op.GatherElements(sequence, sorter, axis=-1)
    if _rank(ctx.inputs[0]) != 1:
        sequence = ctx.op.Unsqueeze(sequence, axes(ctx, -2))  # (..., 1, B) against (..., M, 1)
    expanded = ctx.op.Unsqueeze(values, axes(ctx, -1))
    right = bool(ctx.attrs.get("right")) or ctx.attrs.get("side") == "right"
    below = ctx.op.LessOrEqual(sequence, expanded) if right else ctx.op.Less(sequence, expanded)
    counts = ctx.op.ReduceSum(ctx.op.Cast(below, to=7), axes(ctx, -1), keepdims=0)
    return ctx.op.Cast(counts, to=6) if ctx.attrs.get("out_int32") else counts


class _IsIn(torch.nn.Module):
    def __init__(self, invert: bool) -> None:
        super().__init__()
        self.invert = invert

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.isin(a.round(), b.round(), invert=self.invert)


@converter_case(lambda: _IsIn(invert=False), inputs=[((4, 5), "float32"), ((6,), "float32")])
@converter_case(lambda: _IsIn(invert=True), inputs=[((7,), "float32"), ((2, 3), "float32")])
def convert_isin(ctx: ConverterContext) -> gs.Tensor:
    """``aten::isin.Tensor_Tensor``: is each element equal to any test element (every pair compared; ``invert``
    negates)."""
    elements, tests = ctx.inputs[0], ctx.inputs[1]
    flat = ctx.op.Reshape(tests, const(ctx, np.array([-1], np.int64), "flat"))
    equal = ctx.op.Equal(ctx.op.Unsqueeze(elements, axes(ctx, -1)), flat)
    found = ctx.op.Cast(ctx.op.ReduceMax(ctx.op.Cast(equal, to=6), axes(ctx, -1), keepdims=0), to=9)
    return ctx.op.Not(found) if ctx.attrs.get("invert") else found


def _known_ranks(node: gs.Node, settings: Settings) -> bool:
    return all(_rank(t) is not None for t in node.inputs[:2])


# ---------------------------------------------------------------------------------------------- order statistics


def _known_rank(node: gs.Node, settings: Settings) -> bool:
    """The first input's rank is known."""
    return _rank(node.inputs[0]) is not None


def _along_last(ctx: ConverterContext, compute: Any) -> list[gs.Tensor]:
    """``compute(moved)`` on the input with ``dim`` moved last (``(..., n)`` -> ``(..., 1)`` values and indices),
    put back where ``dim`` was (``keepdim``) or squeezed; a 0-d input is treated as one element."""
    x, rank = ctx.inputs[0], _rank(ctx.inputs[0]) or 0
    if rank == 0:
        x = ctx.op.Unsqueeze(x, axes(ctx, 0))
    dim = int(ctx.attrs.get("dim", -1)) % max(rank, 1)
    perm = [*(i for i in range(max(rank, 1)) if i != dim), dim]
    moved = ctx.op.Transpose(x, perm=perm) if perm != sorted(perm) else x
    results = compute(moved)
    if rank == 0 or not ctx.attrs.get("keepdim"):
        return [ctx.op.Squeeze(r, axes(ctx, -1)) for r in results]
    inverse = [perm.index(i) for i in range(rank)]
    return [ctx.op.Transpose(r, perm=inverse) if perm != sorted(perm) else r for r in results]


class _KthValue(torch.nn.Module):
    def __init__(self, k: int, dim: int, keepdim: bool) -> None:
        super().__init__()
        self.k, self.dim, self.keepdim = k, dim, keepdim

    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.kthvalue(a, self.k, self.dim, self.keepdim)
        return values, indices


@converter_case(lambda: _KthValue(2, -1, False), inputs=[((4, 6), "float32")])
@converter_case(lambda: _KthValue(3, 1, True), inputs=[((2, 5, 3), "float32")])
def convert_kthvalue(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::kthvalue``: the k-th smallest value along ``dim`` and its index: ``TopK(largest=0)``'s last entry
    (ties: the lower index, where PyTorch's selection may pick another)."""
    k = int(ctx.attrs["k"])

    def kth(moved: gs.Tensor) -> list[gs.Tensor]:
        values, indices = ctx.op.TopK(
            moved, const(ctx, np.array([k], np.int64), "k"), axis=-1, largest=0, sorted=1, outputs=2
        )
        return [ctx.op.Slice(t, axes(ctx, k - 1), axes(ctx, k), axes(ctx, -1)) for t in (values, indices)]

    return _along_last(ctx, kth)


def kth_in_range(node: gs.Node, settings: Settings) -> bool:
    """``kthvalue`` with a known rank and ``k`` below TensorRT's TopK limit."""
    return _known_rank(node, settings) and 0 < int(node.attrs.get("k", 1)) < 3840


class _Mode(torch.nn.Module):
    def __init__(self, dim: int, keepdim: bool) -> None:
        super().__init__()
        self.dim, self.keepdim = dim, keepdim

    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.mode((a * 2).round(), self.dim, self.keepdim)
        return values, indices


@converter_case(lambda: _Mode(-1, False), inputs=[((3, 9), "float32")])
@converter_case(lambda: _Mode(0, True), inputs=[((7, 2, 3), "float32")])
def convert_mode(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::mode``: the most frequent value along ``dim`` (ties: the smallest) and the index of its last
    occurrence, as PyTorch; counts from an ``(..., n, n)`` equality."""
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    last = axes(ctx, -1)

    def mode(moved: gs.Tensor) -> list[gs.Tensor]:
        equal = ctx.op.Equal(ctx.op.Unsqueeze(moved, axes(ctx, -1)), ctx.op.Unsqueeze(moved, axes(ctx, -2)))
        counts = ctx.op.ReduceSum(ctx.op.Cast(equal, to=6), last, keepdims=0)
        best = ctx.op.Equal(counts, ctx.op.ReduceMax(counts, last, keepdims=1))
        value = ctx.op.ReduceMin(ctx.op.Where(best, moved, scalar(ctx, float("inf"), dtype)), last, keepdims=1)
        n = _last_length(ctx, moved)
        positions = ctx.op.Range(const(ctx, np.array(0, np.int64)), n, const(ctx, np.array(1, np.int64)))
        hits = ctx.op.Where(ctx.op.Equal(moved, value), positions, const(ctx, np.array(-1, np.int64)))
        return [value, ctx.op.ReduceMax(hits, last, keepdims=1)]

    return _along_last(ctx, mode)


# ---------------------------------------------------------------------------------------------- pooling


def _spatial(node: gs.Node) -> tuple[list[int], list[int]] | None:
    """(input spatial sizes, output sizes) of an adaptive pool with static sizes, or None."""
    shape, sizes = _shape_of(node.inputs[0]), node.attrs.get("output_size")
    if shape is None or sizes is None:
        return None
    sizes = [int(v) for v in sizes]
    spatial = list(shape[len(shape) - len(sizes) :])
    if len(shape) <= len(sizes) or not all(isinstance(d, int) and d > 0 for d in spatial):
        return None
    return [int(d) for d in spatial], sizes


def _shape_of(tensor: gs.Tensor | None) -> tuple[Any, ...] | None:
    return None if tensor is None or tensor.shape is None else tuple(tensor.shape)


_MAX_CELLS = 1024


def adaptive_static(node: gs.Node, settings: Settings) -> bool:
    """Adaptive max pooling with static spatial sizes and at most ``_MAX_CELLS`` output cells (one small group of
    nodes each)."""
    found = _spatial(node)
    return found is not None and all(o > 0 for o in found[1]) and int(np.prod(found[1])) <= _MAX_CELLS


class _AdaptiveMax(torch.nn.Module):
    def __init__(self, size: tuple[int, ...]) -> None:
        super().__init__()
        self.size = size

    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pool = (
            torch.nn.functional.adaptive_max_pool2d if len(self.size) == 2 else torch.nn.functional.adaptive_max_pool3d
        )
        values, indices = pool(a, self.size, return_indices=True)
        return values, indices


@converter_case(lambda: _AdaptiveMax((2, 3)), inputs=[((1, 4, 5, 7), "float32")])
@converter_case(lambda: _AdaptiveMax((3, 3)), inputs=[((2, 6, 6), "float32")], dynamic={"a": {0: ("c", 1, 2, 4)}})
@converter_case(lambda: _AdaptiveMax((2, 1, 3)), inputs=[((1, 2, 4, 3, 5), "float32")])
def convert_adaptive_max_pool(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::adaptive_max_pool2d`` / ``3d``: ``(values, indices)``, one region per output cell (rows
    ``floor(i*H/oh)`` to ``ceil((i+1)*H/oh)``, likewise for the other axes): its maximum and the flat index of
    its first maximum in the input plane (``ReduceMax`` and ``ArgMax`` of the flattened region), as PyTorch."""
    found = _spatial(ctx.node)
    assert found is not None
    spatial, sizes = found
    x, nd = ctx.inputs[0], len(sizes)
    lead = len(_shape_of(x) or ()) - nd
    values, indices = [], []
    for cell in np.ndindex(*sizes):
        starts = [(i * d) // o for i, d, o in zip(cell, spatial, sizes, strict=True)]
        ends = [-((-(i + 1) * d) // o) for i, d, o in zip(cell, spatial, sizes, strict=True)]
        region = ctx.op.Slice(
            x,
            const(ctx, np.array(starts, np.int64)),
            const(ctx, np.array(ends, np.int64)),
            axes(ctx, *range(lead, lead + nd)),
        )
        flat = ctx.op.Reshape(region, const(ctx, np.array([0] * lead + [-1], np.int64), "flat"))
        values.append(ctx.op.ReduceMax(flat, axes(ctx, -1), keepdims=1))
        local = ctx.op.ArgMax(flat, axis=-1, keepdims=1)
        indices.append(_global_index(ctx, local, starts, ends, spatial))
    shape = const(ctx, np.array([0] * lead + sizes, np.int64), "shape")
    joined = [ctx.op.Concat(*t, axis=-1) if len(t) > 1 else t[0] for t in (values, indices)]
    return [ctx.op.Reshape(t, shape) for t in joined]


def _global_index(
    ctx: ConverterContext, local: gs.Tensor, starts: list[int], ends: list[int], spatial: list[int]
) -> gs.Tensor:
    """The flat index in the input plane of a flat index ``local`` in the region ``starts:ends``."""
    extents = [e - b for b, e in zip(starts, ends, strict=True)]
    total: gs.Tensor | None = None
    remaining = local
    for axis in range(len(extents) - 1, -1, -1):  # peel coordinates off the last axis first
        coordinate = ctx.op.Add(
            ctx.op.Mod(remaining, const(ctx, np.array(extents[axis], np.int64))),
            const(ctx, np.array(starts[axis], np.int64)),
        )
        remaining = ctx.op.Div(remaining, const(ctx, np.array(extents[axis], np.int64)))
        stride = int(np.prod(spatial[axis + 1 :]))
        term = ctx.op.Mul(coordinate, const(ctx, np.array(stride, np.int64)))
        total = term if total is None else ctx.op.Add(total, term)
    assert total is not None
    return total


# ---------------------------------------------------------------------------------------------- strided views


def _strided_positions(node: gs.Node) -> np.ndarray | None:
    """The flat positions in ``self`` (contiguous) of the strided view's elements, or None when ``self``'s shape
    is not static or the view is out of range or overlaps itself (PyTorch leaves the write order open there)."""
    shape = node.inputs[0].shape
    size, stride = node.attrs.get("size"), node.attrs.get("stride")
    if shape is None or size is None or stride is None or not all(isinstance(d, int) for d in shape):
        return None
    offset = int(node.attrs.get("storage_offset") or 0)
    positions = np.full([int(v) for v in size], offset, np.int64)
    for axis, (length, step) in enumerate(zip(size, stride, strict=True)):
        view = [1] * len(size)
        view[axis] = int(length)
        positions = positions + np.arange(int(length), dtype=np.int64).reshape(view) * int(step)
    numel = int(np.prod(shape))
    flat = positions.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= numel or np.unique(flat).size != flat.size):
        return None
    return flat


def strided_scatterable(node: gs.Node, settings: Settings) -> bool:
    """``as_strided_scatter`` into a static ``self`` through a view that stays inside it and does not overlap."""
    return _strided_positions(node) is not None


class _StridedScatter(torch.nn.Module):
    def __init__(self, size: list[int], stride: list[int], offset: int) -> None:
        super().__init__()
        self.size, self.stride, self.offset = size, stride, offset

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.as_strided_scatter(a, b, self.size, self.stride, self.offset)


@converter_case(lambda: _StridedScatter([2, 2], [1, 2], 1), inputs=[((3, 3), "float32"), ((2, 2), "float32")])
@converter_case(lambda: _StridedScatter([3, 2], [4, 1], 2), inputs=[((4, 4), "float32"), ((3, 2), "float32")])
def convert_as_strided_scatter(ctx: ConverterContext) -> gs.Tensor:
    """``aten::as_strided_scatter``: ``src`` written into ``self`` at the strided view's positions, computed at
    conversion time from the static sizes and strides (one ``ScatterElements`` on the flattened tensor)."""
    positions = _strided_positions(ctx.node)
    assert positions is not None
    shape = [int(d) for d in ctx.input_shapes[0] or ()]
    flat = ctx.op.Reshape(ctx.inputs[0], const(ctx, np.array([-1], np.int64), "flat"))
    updates = ctx.op.Reshape(ctx.inputs[1], const(ctx, np.array([-1], np.int64), "flat"))
    written = ctx.op.ScatterElements(flat, const(ctx, positions, "positions"), updates, axis=0)
    return ctx.op.Reshape(written, const(ctx, np.array(shape, np.int64), "shape"))


def _last_length(ctx: ConverterContext, x: gs.Tensor) -> gs.Tensor:
    """The length of ``x``'s last dimension as a 0-d int64 tensor."""
    return ctx.op.Gather(ctx.op.Shape(x), const(ctx, np.array(-1, np.int64), "last"), axis=0)


def _float_type(dtype: Any) -> int:
    return {np.dtype(np.float16): 10, np.dtype(np.float64): 11}.get(np.dtype(dtype), 1)


def register_aten2_converters(registry: ConverterRegistry) -> None:
    """Register every converter of this module, ``converters/aten/linalg.py`` and ``converters/aten/lu.py`` on
    ``registry``, one explicit call each."""
    register_linalg_converters(registry)
    register_lu_converters(registry)
    register_qr_converters(registry)
    registry.register("aten::index_reduce.default", validator=index_reducible)(convert_index_reduce)
    registry.register("aten::searchsorted.Tensor", validator=searchable)(convert_searchsorted)
    registry.register("aten::isin.Tensor_Tensor", validator=_known_ranks)(convert_isin)
    registry.register("aten::kthvalue.default", validator=kth_in_range)(convert_kthvalue)
    registry.register("aten::mode.default", validator=_known_rank)(convert_mode)
    registry.register("aten::adaptive_max_pool2d.default", validator=adaptive_static)(convert_adaptive_max_pool)
    registry.register("aten::adaptive_max_pool3d.default", validator=adaptive_static)(convert_adaptive_max_pool)
    registry.register("aten::as_strided_scatter.default", validator=strided_scatterable)(convert_as_strided_scatter)
