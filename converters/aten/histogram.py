"""``torch.histogram`` and ``torch.histogramdd`` with bin counts (``aten::histogram.bin_ct``,
``aten::_histogramdd_from_bin_cts``): a static number of bins, the range from the input's min/max unless given,
optional weights and density, without a scatter (a one-hot count)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.aten.case_modules import Binary, Unary
from converters.aten.numeric.linalg_steps import axes, const, scalar
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from converters.settings import Settings


def _histogramdd_supported(node: gs.Node, settings: Settings) -> bool:
    """A float input of known rank whose last dimension is ``len(bins)``, positive bin counts, and a range of
    finite pairs, lowest first, when one is given."""
    values, bins = node.inputs[0], [int(b) for b in node.attrs.get("bins", [])]
    floating = values.dtype is not None and np.issubdtype(np.dtype(values.dtype), np.floating)
    shape = values.shape
    matches = shape is not None and len(shape) >= 1 and shape[-1] == len(bins) and all(b >= 1 for b in bins)
    given = node.attrs.get("range")
    pairs = given is None or (
        len(given) == 2 * len(bins)
        and bool(np.isfinite(given).all())
        and all(given[2 * d] <= given[2 * d + 1] for d in range(len(bins)))
    )
    return floating and matches and pairs


def _histogram_supported(node: gs.Node, settings: Settings) -> bool:
    """A float input, a positive bin count, and a range of two finite numbers, lowest first, when one is given."""
    values = node.inputs[0]
    floating = values.dtype is not None and np.issubdtype(np.dtype(values.dtype), np.floating)
    bins = int(node.attrs.get("bins", 100))
    given = node.attrs.get("range")
    good_range = given is None or (len(given) == 2 and np.isfinite(given).all() and given[0] <= given[1])
    return floating and bins >= 1 and good_range


@converter_case(lambda: Unary(lambda a: torch.histogram(a, 6)), inputs=[((5, 7), "float32")])
@converter_case(
    lambda: Unary(lambda a: torch.histogram(a, 4, range=(-1.0, 1.5), density=True)), inputs=[((40,), "float32")]
)
@converter_case(
    lambda: Binary(lambda a, w: torch.histogram(a, 5, weight=w.abs(), density=True)),
    inputs=[((3, 8), "float32"), ((3, 8), "float32")],
)
@converter_case(lambda: Unary(lambda a: torch.histogram(a, 1)), inputs=[((), "float32")])
def convert_histogram(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::histogram.bin_ct``: ``(hist, bin_edges)``, the one-dimensional case of :func:`uniform_edges` and
    :func:`histogram_counts`."""
    values = ctx.op.Reshape(ctx.inputs[0], axes(ctx, -1, 1))
    given = ctx.attrs.get("range")
    bins = [int(ctx.attrs["bins"])]
    edges = uniform_edges(ctx, values, bins, None if given is None else list(given))
    return [histogram_counts(ctx, values, edges, bins), edges[0]]


def _given_edges(node: gs.Node, settings: Settings) -> bool:
    """A float input and 1-D float edges of a static length of at least 2."""
    values, edges = node.inputs[0], node.inputs[1]
    floating = all(t.dtype is not None and np.issubdtype(np.dtype(t.dtype), np.floating) for t in (values, edges))
    shape = edges.shape
    return floating and shape is not None and len(shape) == 1 and isinstance(shape[0], int) and shape[0] >= 2


@converter_case(
    lambda: Binary(lambda a, e: torch.histogram(a, e.sort().values, density=True)),
    inputs=[((4, 9), "float32"), ((5,), "float32")],
)
@converter_case(
    lambda: Binary(lambda a, e: torch.histogram(a, e.abs().cumsum(0) - 1.5)),
    inputs=[((30,), "float32"), ((2,), "float32")],
)
def convert_histogram_edges(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::histogram.bins_tensor``: ``(hist, bin_edges)`` for edges given as a (sorted) tensor, counted by
    :func:`histogram_counts` like PyTorch's binary search; the edges are returned unchanged."""
    values = ctx.op.Reshape(ctx.inputs[0], axes(ctx, -1, 1))
    edges = ctx.inputs[1]
    bins = [int(ctx.input_shapes[1][0]) - 1]  # type: ignore[index]
    return [histogram_counts(ctx, values, [edges], bins), ctx.op.Identity(edges)]


def uniform_edges(
    ctx: ConverterContext, points: gs.Tensor, bins: list[int], given: list[float] | None
) -> list[gs.Tensor]:
    """Each dimension's edges for ``points`` (``(n, D)``, ``D = len(bins)``): ``linspace(lo, hi, bins + 1)``
    computed as PyTorch's scalar kernel does (``lo + step * i`` for the first half, ``hi - step * (bins - i)``
    for the rest), ``lo, hi`` the given range or the column's min and max (an empty range widened by 0.5 each
    side)."""
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    edges = []
    for dim, count in enumerate(bins):
        column = ctx.op.Gather(points, const(ctx, np.array([dim], np.int64), "dim"), axis=1)  # (n, 1)
        limits = None if given is None else (float(given[2 * dim]), float(given[2 * dim + 1]))
        low, high = _outer_edges(ctx, column, limits, dtype)
        edges.append(_linspace(ctx, low, high, count, dtype))
    return edges


def histogram_counts(ctx: ConverterContext, points: gs.Tensor, edges: list[gs.Tensor], bins: list[int]) -> gs.Tensor:
    """The histogram (shape ``bins``) of ``points`` (``(n, D)``) over each dimension's ``edges`` (``bins[d] + 1``).

    A point with every coordinate within its dimension's first and last edge falls in the bin counted by the
    interior edges at or below each coordinate (the last bin includes the last edge); the bins sum ones or the
    node's ``weight`` over a one-hot ``(n, bins...)`` comparison. The node's ``density`` divides by the total,
    then by each dimension's bin widths, in PyTorch's order."""
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    cells = int(np.prod(bins))
    flat: gs.Tensor | None = None
    inside: gs.Tensor | None = None
    for dim, (count, dim_edges) in enumerate(zip(bins, edges, strict=True)):
        column = ctx.op.Gather(points, const(ctx, np.array([dim], np.int64), "dim"), axis=1)  # (n, 1)
        interior = ctx.op.Slice(dim_edges, axes(ctx, 1), axes(ctx, count), axes(ctx, 0))  # (count - 1,)
        # an empty sum (one bin) is 0
        position = ctx.op.ReduceSum(ctx.op.Cast(ctx.op.LessOrEqual(interior, column), to=7), axes(ctx, -1))
        stride = int(np.prod(bins[dim + 1 :]))
        term = ctx.op.Mul(position, const(ctx, np.array(stride, np.int64), "stride"))
        flat = term if flat is None else ctx.op.Add(flat, term)
        low = ctx.op.Slice(dim_edges, axes(ctx, 0), axes(ctx, 1), axes(ctx, 0))
        high = ctx.op.Slice(dim_edges, axes(ctx, count), axes(ctx, count + 1), axes(ctx, 0))
        within = ctx.op.And(ctx.op.GreaterOrEqual(column, low), ctx.op.LessOrEqual(column, high))
        inside = within if inside is None else ctx.op.And(inside, within)
    assert flat is not None and inside is not None
    one_hot = ctx.op.And(ctx.op.Equal(flat, const(ctx, np.arange(cells, dtype=np.int64), "cells")), inside)
    weight = ctx.input("weight")
    if weight is None:
        hist = ctx.op.ReduceSum(ctx.op.CastLike(one_hot, points), axes(ctx, 0), keepdims=0)
    else:
        weights = ctx.op.Reshape(weight, axes(ctx, -1, 1))
        hist = ctx.op.ReduceSum(ctx.op.Where(one_hot, weights, scalar(ctx, 0.0, dtype)), axes(ctx, 0), keepdims=0)
    hist = ctx.op.Reshape(hist, const(ctx, np.array(bins, np.int64), "bins"))
    if ctx.attrs["density"]:
        hist = ctx.op.Div(hist, ctx.op.ReduceSum(hist, keepdims=0))
        for dim, (count, dim_edges) in enumerate(zip(bins, edges, strict=True)):
            widths = ctx.op.Sub(
                ctx.op.Slice(dim_edges, axes(ctx, 1), axes(ctx, count + 1), axes(ctx, 0)),
                ctx.op.Slice(dim_edges, axes(ctx, 0), axes(ctx, count), axes(ctx, 0)),
            )
            shape = [1] * len(bins)
            shape[dim] = count
            hist = ctx.op.Div(hist, ctx.op.Reshape(widths, const(ctx, np.array(shape, np.int64), "widths")))
    return hist


@converter_case(lambda: Unary(lambda a: torch.histogramdd(a, [3, 2]).hist), inputs=[((20, 2), "float32")])
@converter_case(
    lambda: Binary(
        lambda a, w: (
            torch.histogramdd(a, [2, 3, 2], range=[-1.0, 1.0, -2.0, 0.5, 0.0, 1.0], weight=w.abs(), density=True).hist
        )
    ),
    inputs=[((4, 6, 3), "float32"), ((4, 6), "float32")],
)
def convert_histogramdd_counts(ctx: ConverterContext) -> gs.Tensor:
    """``aten::_histogramdd_from_bin_cts``: ``torch.histogramdd``'s counts for bins given as numbers, from
    :func:`histogram_counts` over the input's last dimension (its bin edges are the program fix's
    ``histogram.bin_ct`` per dimension, ``pipeline/exporting/histogram_edges.py``)."""
    bins = [int(b) for b in ctx.attrs["bins"]]
    points = ctx.op.Reshape(ctx.inputs[0], const(ctx, np.array([-1, len(bins)], np.int64), "points"))
    given = ctx.attrs.get("range")
    return histogram_counts(ctx, points, uniform_edges(ctx, points, bins, None if given is None else list(given)), bins)


def _outer_edges(
    ctx: ConverterContext, column: gs.Tensor, limits: tuple[float, float] | None, dtype: Any
) -> tuple[gs.Tensor, gs.Tensor]:
    """The leftmost and rightmost edges (shape ``(1,)``): the given limits or the column's min and max, moved
    apart by 0.5 each way when equal (numpy's rule, which PyTorch follows)."""
    if limits is not None:
        low_value, high_value = limits
        if low_value == high_value:
            low_value, high_value = low_value - 0.5, high_value + 0.5
        return const(ctx, np.array([low_value], dtype), "low"), const(ctx, np.array([high_value], dtype), "high")
    flat = ctx.op.Reshape(column, axes(ctx, -1))
    low = ctx.op.ReduceMin(flat, axes(ctx, 0), keepdims=1)
    high = ctx.op.ReduceMax(flat, axes(ctx, 0), keepdims=1)
    same = ctx.op.Equal(low, high)
    half = scalar(ctx, 0.5, dtype)
    return ctx.op.Where(same, ctx.op.Sub(low, half), low), ctx.op.Where(same, ctx.op.Add(high, half), high)


def _linspace(ctx: ConverterContext, low: gs.Tensor, high: gs.Tensor, bins: int, dtype: Any) -> gs.Tensor:
    """``bins + 1`` edges from ``low`` to ``high`` (both ``(1,)``) with PyTorch's scalar linspace formula."""
    steps = bins + 1
    index = np.arange(steps)
    step = ctx.op.Div(ctx.op.Sub(high, low), scalar(ctx, float(bins), dtype))
    front = ctx.op.Add(low, ctx.op.Mul(step, const(ctx, index.astype(dtype), "front")))
    back = ctx.op.Sub(high, ctx.op.Mul(step, const(ctx, (steps - 1 - index).astype(dtype), "back")))
    return ctx.op.Where(const(ctx, index < steps // 2, "half"), front, back)


def register_histogram_converters(registry: ConverterRegistry) -> None:
    """Register the histogram converters on ``registry``."""
    registry.register("aten::histogram.bin_ct", validator=_histogram_supported)(convert_histogram)
    registry.register("aten::histogram.bins_tensor", validator=_given_edges)(convert_histogram_edges)
    registry.register("aten::_histogramdd_from_bin_cts.default", validator=_histogramdd_supported)(
        convert_histogramdd_counts
    )
