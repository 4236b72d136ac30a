"""``torch.histogram`` with a bin count (``aten::histogram.bin_ct``): a static number of bins, the range from
the input's min/max unless given, optional weights and density, without a scatter (a one-hot count)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.case_modules import Binary, Unary
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.linalg_steps import axes, const, scalar
from converters.registry import ConverterRegistry
from converters.settings import Settings


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
    """``aten::histogram.bin_ct``: ``(hist, bin_edges)``. The edges are ``linspace(lo, hi, bins + 1)`` computed
    as PyTorch's scalar kernel does (``lo + step * i`` for the first half, ``hi - step * (bins - i)`` for the
    rest; an empty range widened by 0.5 each side); each value in ``[lo, hi]`` falls in the bin counted by the
    interior edges at or below it (the last bin includes ``hi``), and the bins sum ones or the weights over a
    one-hot ``(values, bins)`` comparison. ``density`` divides by the total, then by each bin's width."""
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    bins = int(ctx.attrs["bins"])
    values = ctx.op.Reshape(ctx.inputs[0], axes(ctx, -1))
    low, high = _outer_edges(ctx, values, dtype)
    edges = _linspace(ctx, low, high, bins, dtype)
    interior = ctx.op.Slice(edges, axes(ctx, 1), axes(ctx, bins), axes(ctx, 0))  # (bins - 1,)
    column = ctx.op.Unsqueeze(values, axes(ctx, -1))  # (n, 1)
    position = ctx.op.ReduceSum(
        ctx.op.Cast(ctx.op.LessOrEqual(interior, column), to=7), axes(ctx, -1), keepdims=1
    )  # (n, 1) int64; an empty sum (one bin) is 0
    inside = ctx.op.And(ctx.op.GreaterOrEqual(column, low), ctx.op.LessOrEqual(column, high))
    one_hot = ctx.op.And(ctx.op.Equal(position, const(ctx, np.arange(bins, dtype=np.int64), "bins")), inside)
    weight = ctx.input("weight")
    if weight is None:
        hist = ctx.op.ReduceSum(ctx.op.CastLike(one_hot, values), axes(ctx, 0), keepdims=0)
    else:
        weights = ctx.op.Unsqueeze(ctx.op.Reshape(weight, axes(ctx, -1)), axes(ctx, -1))
        hist = ctx.op.ReduceSum(ctx.op.Where(one_hot, weights, scalar(ctx, 0.0, dtype)), axes(ctx, 0), keepdims=0)
    if ctx.attrs["density"]:
        hist = ctx.op.Div(hist, ctx.op.ReduceSum(hist, axes(ctx, 0), keepdims=1))
        widths = ctx.op.Sub(
            ctx.op.Slice(edges, axes(ctx, 1), axes(ctx, bins + 1), axes(ctx, 0)),
            ctx.op.Slice(edges, axes(ctx, 0), axes(ctx, bins), axes(ctx, 0)),
        )
        hist = ctx.op.Div(hist, widths)
    return [hist, edges]


def _outer_edges(ctx: ConverterContext, values: gs.Tensor, dtype: Any) -> tuple[gs.Tensor, gs.Tensor]:
    """The leftmost and rightmost edges (shape ``(1,)``): the given range or the values' min and max, moved
    apart by 0.5 each way when equal (numpy's rule, which PyTorch follows)."""
    given = ctx.attrs.get("range")
    if given is not None:
        low_value, high_value = float(given[0]), float(given[1])
        if low_value == high_value:
            low_value, high_value = low_value - 0.5, high_value + 0.5
        return const(ctx, np.array([low_value], dtype), "low"), const(ctx, np.array([high_value], dtype), "high")
    low = ctx.op.ReduceMin(values, axes(ctx, 0), keepdims=1)
    high = ctx.op.ReduceMax(values, axes(ctx, 0), keepdims=1)
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
    """Register the histogram converter on ``registry``."""
    registry.register("aten::histogram.bin_ct", validator=_histogram_supported)(convert_histogram)
