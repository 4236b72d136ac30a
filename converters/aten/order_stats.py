"""Order statistics: ``median`` and ``nanmedian`` (values and indices) by one ascending ``TopK``; ``cummax`` and
``cummin`` by pairwise comparison. (``kthvalue`` and ``mode`` are in :mod:`converters.aten.tensor`.)

The reduced axis is sorted whole (``TopK`` with ``k`` = its length, smallest first, NaN moved to the end as
+inf), and the wanted rank is gathered per slice: a fixed rank for ``median``, ``(count - 1) // 2``
of the non-NaN values for ``nanmedian``. ``median`` returns NaN (and its index) where the slice holds one, as
PyTorch does. The axis must have a static length (TensorRT's ``TopK`` needs a build-time ``k``, below 3840):
the validators decline other nodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.aten.numeric.math_builder import Math
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry

_MAX_TOPK = 3840


def _axis_and_length(node: gs.Node, dim: Any) -> tuple[int, int] | None:
    """The normalised axis and its static length, or None when unknown or too long for TensorRT's TopK."""
    shape = node.inputs[0].shape
    if shape is None:
        return None
    if dim is None:
        if not all(isinstance(d, int) for d in shape):
            return None
        length = int(np.prod(shape, dtype=np.int64))
        return (0, length) if 0 < length < _MAX_TOPK else None
    rank = len(shape)
    axis = int(dim) % max(rank, 1)
    if rank == 0:
        return (0, 1)
    length = shape[axis]
    return (axis, length) if isinstance(length, int) and 0 < length < _MAX_TOPK else None


def _static_axis(node: gs.Node, settings: object) -> bool:
    return _axis_and_length(node, node.attrs.get("dim") if "dim" in node.attrs else None) is not None


def _sorted(ctx: ConverterContext, x: gs.Tensor, axis: int, length: int) -> tuple[Any, Any]:
    """Values ascending along ``axis`` (NaN as +inf at the end) and their original indices."""
    m = Math(ctx, ctx.input_dtypes[0] or np.float32)
    xe = m.wrap(x)
    keyed = m.where(m.isnan(xe), float("inf"), xe) if m.dtype.kind == "f" else xe
    k = ctx.constant(np.array([length], np.int64))
    values, indices = ctx.op.TopK(keyed.tensor, k, axis=axis, largest=0, sorted=1, outputs=2)
    return values, indices


def _select(
    ctx: ConverterContext,
    axis: int,
    length: int,
    rank_index: int | gs.Tensor,
    keepdim: bool,
    propagate_nan: bool,
    x: gs.Tensor | None = None,
) -> tuple[gs.Tensor, gs.Tensor]:
    """The element of sorted rank ``rank_index`` (a number, or a per-slice tensor with 1 at ``axis``) along
    ``axis`` of ``x`` (the node's input by default): (value, index)."""
    x = ctx.inputs[0] if x is None else x
    _, indices = _sorted(ctx, x, axis, length)
    if isinstance(rank_index, gs.Tensor):
        index = ctx.op.GatherElements(indices, rank_index, axis=axis)
    else:
        bounds = [ctx.constant(np.array([v], np.int64)) for v in (rank_index, rank_index + 1, axis)]
        index = ctx.op.Slice(indices, *bounds)
    value = ctx.op.GatherElements(x, index, axis=axis)
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    if propagate_nan and dtype.kind == "f":
        m = Math(ctx, dtype)
        nan = m.cast(m.isnan(m.wrap(x)), onnx.TensorProto.INT32)
        axes = ctx.constant(np.array([axis], np.int64))
        has_nan = m.cast(m.wrap(ctx.op.ReduceMax(nan.tensor, axes, keepdims=1)), onnx.TensorProto.BOOL)
        first_nan = ctx.op.ArgMax(nan.tensor, axis=axis, keepdims=1, select_last_index=0)
        value = m.where(has_nan, float("nan"), m.wrap(value)).tensor
        index = ctx.op.Where(has_nan.tensor, first_nan, index)
    if not keepdim:
        axes = ctx.constant(np.array([axis], np.int64))
        value, index = ctx.op.Squeeze(value, axes), ctx.op.Squeeze(index, axes)
    return value, index


class _Reduce(torch.nn.Module):
    def __init__(self, function: str, *args: Any) -> None:
        super().__init__()
        self.function, self.args = function, args

    def forward(self, x: torch.Tensor) -> Any:
        x = torch.where(x > 1.8, torch.nan, x) if "nan" in self.function else x
        result = getattr(torch, self.function)(x, *self.args)
        return (result.values, result.indices) if hasattr(result, "values") else result


@converter_case(lambda: _Reduce("median", 1, False), inputs=[((4, 7, 3), "float32")])
@converter_case(lambda: _Reduce("median", -1, True), inputs=[((5, 6), "float32")])
def convert_median_dim(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::median.dim``: the lower median ((n-1)//2 in sorted order); NaN (and its index) where the slice has
    one."""
    axis, length = _axis_and_length(ctx.node, ctx.attrs["dim"]) or (0, 1)
    return list(_select(ctx, axis, length, (length - 1) // 2, bool(ctx.attrs["keepdim"]), True))


@converter_case(lambda: _Reduce("nanmedian", 1, False), inputs=[((4, 9, 3), "float32")])
def convert_nanmedian_dim(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::nanmedian.dim``: the lower median of each slice's non-NaN values (NaN where all are NaN)."""
    axis, length = _axis_and_length(ctx.node, ctx.attrs["dim"]) or (0, 1)
    m = Math(ctx, ctx.input_dtypes[0] or np.float32)
    x = m.wrap(ctx.inputs[0])
    valid = m.cast(~m.isnan(x), onnx.TensorProto.INT64)
    count = ctx.op.ReduceSum(valid.tensor, ctx.constant(np.array([axis], np.int64)), keepdims=1)
    one, zero, two = (ctx.constant(np.array(v, np.int64)) for v in (1, 0, 2))
    position = ctx.op.Div(ctx.op.Max(ctx.op.Sub(count, one), zero), two)
    return list(_select(ctx, axis, length, position, bool(ctx.attrs["keepdim"]), False))


def _flat(ctx: ConverterContext) -> gs.Tensor:
    return ctx.op.Reshape(ctx.inputs[0], ctx.constant(np.array([-1], np.int64)))


class _Whole(torch.nn.Module):
    def __init__(self, function: str) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.where(x > 1.5, torch.nan, x) if self.function == "nanmedian" else x
        return getattr(torch, self.function)(x).reshape(1)


@converter_case(lambda: _Whole("median"), inputs=[((4, 7), "float32")])
def convert_median(ctx: ConverterContext) -> gs.Tensor:
    """``aten::median`` (no dim): the lower median of all elements, NaN if any is NaN; a 0-d tensor."""
    _, length = _axis_and_length(ctx.node, None) or (0, 1)
    value, _ = _select(ctx, 0, length, (length - 1) // 2, False, True, x=_flat(ctx))
    return value


@converter_case(lambda: _Whole("nanmedian"), inputs=[((5, 6), "float32")])
def convert_nanmedian(ctx: ConverterContext) -> gs.Tensor:
    """``aten::nanmedian`` (no dim): the lower median of the non-NaN elements; a 0-d tensor."""
    _, length = _axis_and_length(ctx.node, None) or (0, 1)
    flat = _flat(ctx)
    m = Math(ctx, ctx.input_dtypes[0] or np.float32)
    valid = m.cast(~m.isnan(m.wrap(flat)), onnx.TensorProto.INT64)
    count = ctx.op.ReduceSum(valid.tensor, ctx.constant(np.array([0], np.int64)), keepdims=1)
    one, zero, two = (ctx.constant(np.array(v, np.int64)) for v in (1, 0, 2))
    position = ctx.op.Div(ctx.op.Max(ctx.op.Sub(count, one), zero), two)
    value, _ = _select(ctx, 0, length, position, False, False, x=flat)
    return value


def _static_input(node: gs.Node, settings: object) -> bool:
    return _axis_and_length(node, None) is not None


class _Cumulative(torch.nn.Module):
    def __init__(self, function: str, dim: int) -> None:
        super().__init__()
        self.function, self.dim = function, dim

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.round(x * 2.0)  # ties (NaN: tests/converters/aten/test_pointwise.py)
        result = getattr(torch, self.function)(x, self.dim)
        return result.values, result.indices


def _cumulative(ctx: ConverterContext, largest: bool) -> list[gs.Tensor]:
    """Running max/min and the index where it was (last) reached, by comparing every pair ``j <= i``: as
    PyTorch's loop ``if (isnan(x) || x >=/<= out) { out = x; idx = j }`` (a NaN, once seen, stays)."""
    axis, length = _axis_and_length(ctx.node, ctx.attrs["dim"]) or (0, 1)
    rank = max(len(ctx.input_shapes[0] or ()), 1)
    m = Math(ctx, ctx.input_dtypes[0] or np.float32)
    x = m.wrap(ctx.inputs[0])
    if not (ctx.input_shapes[0] or ()):
        x = m.wrap(ctx.op.Reshape(x.tensor, ctx.constant(np.array([1], np.int64))))
    trailing = [1] * (rank - 1 - axis)
    earlier = np.tril(np.ones((length, length), bool)).reshape([length, length, *trailing])
    positions = np.arange(length, dtype=np.int64).reshape([1, length, *trailing])
    other = m.wrap(ctx.op.Unsqueeze(x.tensor, ctx.constant(np.array([axis], np.int64))))  # x_j
    mask = m.wrap(ctx.constant(earlier))
    fill = float("-inf") if largest else float("inf")
    candidates = m.where(mask, m.where(m.isnan(other), fill, other), fill)
    reduce_axis = ctx.constant(np.array([axis + 1], np.int64))
    best = m.apply("ReduceMax" if largest else "ReduceMin", candidates, reduce_axis, keepdims=1)
    nan_before = mask & m.isnan(other)
    index_of = m.wrap(ctx.constant(positions))
    hit = mask & other.eq(best)
    minus_one = m.wrap(ctx.constant(np.array(-1, np.int64)))
    last_hit = m.apply("ReduceMax", m.where(hit, index_of, minus_one), reduce_axis, keepdims=0)
    big = ctx.constant(np.array(length, np.int64))
    first_nan = m.apply("ReduceMin", m.where(nan_before, index_of, m.wrap(big)), reduce_axis, keepdims=0)
    seen_nan = m.apply("ReduceMax", m.cast(nan_before, onnx.TensorProto.INT32), reduce_axis, keepdims=0)
    seen = m.cast(seen_nan, onnx.TensorProto.BOOL)
    squeezed = m.wrap(ctx.op.Squeeze(best.tensor, reduce_axis))
    values = m.where(seen, float("nan"), squeezed)
    indices = m.where(seen, first_nan, last_hit)
    if not (ctx.input_shapes[0] or ()):
        scalar = ctx.constant(np.array([], np.int64))
        return [ctx.op.Reshape(values.tensor, scalar), ctx.op.Reshape(indices.tensor, scalar)]
    return [values.tensor, indices.tensor]


@converter_case(lambda: _Cumulative("cummax", 1), inputs=[((3, 6, 2), "float32")])
def convert_cummax(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::cummax``: running maximum and its (last) index; NaN propagates from where it appears."""
    return _cumulative(ctx, largest=True)


@converter_case(lambda: _Cumulative("cummin", 0), inputs=[((7, 3), "float32")])
def convert_cummin(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::cummin``: running minimum and its (last) index; NaN propagates from where it appears."""
    return _cumulative(ctx, largest=False)


def register_order_stat_converters(registry: ConverterRegistry) -> None:
    """median and nanmedian (whole tensor or along a dim), cummax and cummin (static reduced axis)."""
    registry.register("aten::median.default", validator=_static_input)(convert_median)
    registry.register("aten::nanmedian.default", validator=_static_input)(convert_nanmedian)
    registry.register("aten::median.dim", validator=_static_axis)(convert_median_dim)
    registry.register("aten::nanmedian.dim", validator=_static_axis)(convert_nanmedian_dim)
    registry.register("aten::cummax.default", validator=_static_axis)(convert_cummax)
    registry.register("aten::cummin.default", validator=_static_axis)(convert_cummin)
