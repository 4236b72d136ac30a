"""Built-in converters for ATen ops the exporter has no ONNX translation for: ``pdist``, ``put``, ``rrelu`` (random
in training), ``segment_reduce`` and ``resize``. ``register_more_converters`` is the one list, with those of
``converters/aten/histogram.py`` (``histogram``, ``histogramdd``'s counts), ``converters/aten/losses.py``
(``linear_cross_entropy``'s chunked ops, unbatched class losses) and ``converters/aten/grid3d.py``
(``grid_sampler_3d``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.aten.case_modules import Binary, Ternary, Unary
from converters.aten.grid3d import register_grid3d_converters
from converters.aten.histogram import register_histogram_converters
from converters.aten.losses import register_loss_converters
from converters.aten.numeric.linalg_steps import axes, const, scalar
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from converters.settings import Settings

_FLOAT = 1  # onnx.TensorProto.FLOAT
_BOOL = 9  # onnx.TensorProto.BOOL


def _shape(tensor: gs.Tensor | None) -> tuple[Any, ...] | None:
    return None if tensor is None or tensor.shape is None else tuple(tensor.shape)


def _static(tensor: gs.Tensor | None) -> tuple[int, ...] | None:
    """The tensor's shape when every dimension is a known int, else None."""
    shape = _shape(tensor)
    return shape if shape is not None and all(isinstance(d, int) for d in shape) else None


def _dtype(ctx: ConverterContext, index: int = 0) -> np.dtype:
    return ctx.input_dtypes[index] or np.dtype(np.float32)


# --------------------------------------------------------------------------------------------------- pdist


def _pdist_static(node: gs.Node, settings: Settings) -> bool:
    """``pdist`` of a float ``(N, M)`` input with a static ``N`` and ``p >= 0``."""
    shape = _shape(node.inputs[0])
    p = float(node.attrs.get("p", 2.0))
    return shape is not None and len(shape) == 2 and isinstance(shape[0], int) and p >= 0 and not math.isnan(p)


def p_norm(ctx: ConverterContext, diff: gs.Tensor, p: float, dtype: Any) -> gs.Tensor:
    """The ``p``-norm of ``diff`` over its last axis as PyTorch's distance kernels compute it: the count of
    non-zero entries for ``p = 0``, the largest magnitude for ``inf``, ``(sum |d|^p)^(1/p)`` otherwise."""
    last = axes(ctx, -1)
    if p == 0.0:
        differs = ctx.op.Not(ctx.op.Equal(diff, scalar(ctx, 0.0, dtype)))
        return ctx.op.ReduceSum(ctx.op.CastLike(differs, diff), last, keepdims=0)
    if math.isinf(p):
        return ctx.op.ReduceMax(ctx.op.Abs(diff), last, keepdims=0)
    if p == 2.0:
        return ctx.op.Sqrt(ctx.op.ReduceSumSquare(diff, last, keepdims=0))
    if p == 1.0:
        return ctx.op.ReduceSum(ctx.op.Abs(diff), last, keepdims=0)
    summed = ctx.op.ReduceSum(ctx.op.Pow(ctx.op.Abs(diff), scalar(ctx, p, dtype)), last, keepdims=0)
    return ctx.op.Pow(summed, scalar(ctx, 1.0 / p, dtype))


class _Pdist(torch.nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pdist(x, p=self.p)


@converter_case(lambda: _Pdist(2.0), inputs=[((6, 4), "float32")])
@converter_case(lambda: _Pdist(1.0), inputs=[((5, 3), "float32")])
@converter_case(lambda: _Pdist(math.inf), inputs=[((4, 3), "float32")], dynamic={"x": {1: ("m", 1, 3, 8)}})
@converter_case(lambda: _Pdist(1.5), inputs=[((5, 2), "float32")])
def convert_pdist(ctx: ConverterContext) -> gs.Tensor:
    """``aten::_pdist_forward``: the ``p``-norm distance of every row pair ``i < j`` in row-major order, from
    ``x[i] - x[j]`` gathered with constant pair indices (exact, like PyTorch: no ``|x|^2 - 2xy`` cancellation).
    With fewer than two rows the result is empty: a constant of shape ``(0,)``."""
    x = ctx.inputs[0]
    rows = int(ctx.input_shapes[0][0])  # type: ignore[index]
    dtype = _dtype(ctx)
    first, second = np.triu_indices(rows, 1)
    if first.size == 0:
        return ctx.constant(np.zeros((0,), dtype), "empty")
    diff = ctx.op.Sub(
        ctx.op.Gather(x, const(ctx, first.astype(np.int64), "first"), axis=0),
        ctx.op.Gather(x, const(ctx, second.astype(np.int64), "second"), axis=0),
    )
    return p_norm(ctx, diff, float(ctx.attrs["p"]), dtype)


# ----------------------------------------------------------------------------------------------------- put


def _put_plain(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    index = ((b * 7).long() % a.numel() - a.numel() // 2).flatten()[: c.numel()]  # negative indices too
    return torch.put(a, index, c.flatten()[: index.numel()], accumulate=True)


def _put_unique(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    index = torch.argsort(b.flatten())[:3] - 4
    return torch.put(a, index.reshape(3, 1), b.flatten()[:3], accumulate=False)


@converter_case(lambda: Ternary(_put_plain), inputs=[((3, 4), "float32"), ((6,), "float32"), ((2, 3), "float32")])
@converter_case(lambda: Binary(_put_unique), inputs=[((2, 5), "float32"), ((8,), "float32")])
def convert_put(ctx: ConverterContext) -> gs.Tensor:
    """``aten::put``: ``self.flatten()[index] = source`` on the flattened tensor; negative indices count from the
    end (``Mod`` by the size). Without ``accumulate``, one ``ScatterElements``. With it, the sources that hit each
    element are summed over a one-hot ``(k, size)`` mask (``Where`` + ``ReduceSum``: TensorRT's parser takes no
    ``ScatterElements`` reduction) and added: the same sums as PyTorch's up to their order."""
    values, index, source = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    flat_shape = axes(ctx, -1)
    flat = ctx.op.Reshape(values, flat_shape)
    size = ctx.op.Size(values)
    positions = ctx.op.Mod(ctx.op.Reshape(index, flat_shape), size, fmod=0)  # Python's %: -1 -> size - 1
    sources = ctx.op.Reshape(source, flat_shape)
    if not ctx.attrs["accumulate"]:
        scattered = ctx.op.ScatterElements(flat, positions, sources, axis=0)
        return ctx.op.Reshape(scattered, ctx.op.Shape(values))
    zero = const(ctx, np.array(0, np.int64))
    every = ctx.op.Range(zero, size, const(ctx, np.array(1, np.int64)))
    hits = ctx.op.Equal(ctx.op.Unsqueeze(positions, axes(ctx, -1)), every)  # (k, size)
    column = ctx.op.Unsqueeze(sources, axes(ctx, -1))
    added = ctx.op.ReduceSum(ctx.op.Where(hits, column, scalar(ctx, 0.0, _dtype(ctx))), axes(ctx, 0), keepdims=0)
    return ctx.op.Reshape(ctx.op.Add(flat, added), ctx.op.Shape(values))


# --------------------------------------------------------------------------------------------------- rrelu


class _Rrelu(torch.nn.Module):
    def __init__(self, training: bool) -> None:
        super().__init__()
        self.training_mode = training

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rrelu(x, 0.1, 0.4, training=self.training_mode)


@converter_case(lambda: _Rrelu(False), inputs=[((3, 7), "float32")])  # training: tests/converters/aten/test_more.py
def convert_rrelu(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::rrelu_with_noise_functional``: ``x`` where ``x >= 0``, else ``x * a``. In eval mode ``a`` is the
    mean slope ``(lower + upper) / 2`` and the noise passes through; in training ``a`` is drawn per element from
    ``U(lower, upper)`` by a ``RandomUniformLike`` node (so validation judges the output by its distribution)
    and the noise output holds ``a`` where ``x <= 0`` and 1 elsewhere, as PyTorch writes it."""
    x, noise = ctx.inputs[0], ctx.inputs[1]
    dtype = _dtype(ctx)
    lower, upper = float(ctx.attrs["lower"]), float(ctx.attrs["upper"])
    zero = scalar(ctx, 0.0, dtype)
    if not ctx.attrs["training"]:
        slope = scalar(ctx, (lower + upper) / 2, dtype)
        out = ctx.op.Where(ctx.op.GreaterOrEqual(x, zero), x, ctx.op.Mul(x, slope))
        return [out, ctx.op.Identity(noise)]
    slopes = ctx.op.RandomUniformLike(x, low=lower, high=upper)
    negative = ctx.op.LessOrEqual(x, zero)
    out = ctx.op.Where(negative, ctx.op.Mul(x, slopes), x)
    return [out, ctx.op.Where(negative, slopes, scalar(ctx, 1.0, dtype))]


# ------------------------------------------------------------------------------------------ segment_reduce

_SEGMENT_REDUCTIONS = ("max", "min", "sum", "mean", "prod")


def _segments_1d(node: gs.Node, settings: Settings) -> bool:
    """``segment_reduce`` of float data along axis 0 with 1-D ``lengths`` or ``offsets`` (no ``indices``)."""
    inputs = list(node.inputs) + [None] * 4
    given = [t for t in inputs[1:4] if t is not None and t.name != ""]
    reduce = node.attrs.get("reduce", b"")
    reduce = reduce.decode() if isinstance(reduce, bytes) else str(reduce)
    one_d = len(given) == 1 and given[0] is not inputs[2] and len(_shape(given[0]) or ()) == 1
    rank = len(_shape(node.inputs[0]) or ())
    return one_d and rank >= 1 and int(node.attrs.get("axis", 0)) in (0, -rank) and reduce in _SEGMENT_REDUCTIONS


class _SegmentReduce(torch.nn.Module):
    def __init__(
        self, reduce: str, initial: float | None, offsets: bool, lengths: tuple[int, ...] = (2, 0, 3, 1, 0)
    ) -> None:
        super().__init__()
        self.reduce, self.initial, self.offsets, self.lengths = reduce, initial, offsets, lengths

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        lengths = torch.tensor(self.lengths)
        if self.offsets:
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
            return torch.segment_reduce(data, self.reduce, offsets=offsets, initial=self.initial)
        return torch.segment_reduce(data, self.reduce, lengths=lengths, initial=self.initial)


@converter_case(lambda: _SegmentReduce("max", None, False), inputs=[((6,), "float32")])
@converter_case(lambda: _SegmentReduce("min", 1.0, True), inputs=[((6, 3), "float32")])
@converter_case(lambda: _SegmentReduce("sum", 2.0, False), inputs=[((6,), "float32")])
@converter_case(lambda: _SegmentReduce("mean", None, True, (2, 3, 1)), inputs=[((6, 2), "float32")])
@converter_case(lambda: _SegmentReduce("mean", 2.0, False), inputs=[((6,), "float32")])
@converter_case(lambda: _SegmentReduce("prod", 2.0, True), inputs=[((6,), "float32")])
def convert_segment_reduce(ctx: ConverterContext) -> gs.Tensor:
    """``aten::segment_reduce`` along axis 0 with 1-D ``lengths`` or ``offsets``: a ``(S, N)`` mask ``start_s <=
    n < end_s`` selects each segment's rows, reduced with ``Where`` + ``ReduceMax/Min/Sum/Prod`` on the data
    moved to ``(..., 1, N)``. ``initial`` takes part in every segment (``max(initial, ...)``, ``initial + sum``,
    ``initial * prod``, ``(initial + sum) / count``) and fills empty ones; without it an empty segment is
    ``-inf``/``inf``/0/1 and NaN for ``mean``, as in PyTorch."""
    data = ctx.inputs[0]
    lengths, offsets = ctx.input("lengths"), ctx.input("offsets")
    rank = len(ctx.input_shapes[0] or ())
    dtype = _dtype(ctx)
    if lengths is not None:
        ends = ctx.op.CumSum(lengths, const(ctx, np.array(0, np.int64)))
        starts = ctx.op.Sub(ends, lengths)
    else:
        starts = ctx.op.Slice(offsets, axes(ctx, 0), axes(ctx, -1), axes(ctx, 0))
        ends = ctx.op.Slice(offsets, axes(ctx, 1), axes(ctx, np.iinfo(np.int64).max), axes(ctx, 0))
    n = ctx.op.Gather(ctx.op.Shape(data), const(ctx, np.array(0, np.int64)), axis=0)
    counting = ctx.op.Range(const(ctx, np.array(0, np.int64)), n, const(ctx, np.array(1, np.int64)))
    positions = ctx.op.CastLike(counting, starts)
    column = axes(ctx, -1)
    inside = ctx.op.And(
        ctx.op.LessOrEqual(ctx.op.Unsqueeze(starts, column), positions),
        ctx.op.Less(positions, ctx.op.Unsqueeze(ends, column)),
    )  # (S, N)
    moved = ctx.op.Transpose(data, perm=[*range(1, rank), 0]) if rank > 1 else data
    moved = ctx.op.Unsqueeze(moved, axes(ctx, -2))  # (..., 1, N)
    result = _segment_values(ctx, moved, inside, dtype)
    return ctx.op.Transpose(result, perm=[rank - 1, *range(rank - 1)]) if rank > 1 else result


def _segment_values(ctx: ConverterContext, moved: gs.Tensor, inside: gs.Tensor, dtype: Any) -> gs.Tensor:
    """Each segment's reduction (``(..., S)``) of ``moved`` (``(..., 1, N)``) over the rows ``inside`` selects."""
    reduce, initial = str(ctx.attrs["reduce"]), ctx.attrs.get("initial")
    last = axes(ctx, -1)
    if reduce == "mean":
        total = ctx.op.ReduceSum(ctx.op.Where(inside, moved, scalar(ctx, 0.0, dtype)), last, keepdims=0)
        count = ctx.op.ReduceSum(ctx.op.CastLike(inside, moved), last, keepdims=0)
        if initial is None:
            return ctx.op.Div(total, count)  # an empty segment: 0 / 0 = NaN, as in PyTorch
        start = scalar(ctx, float(initial), dtype)
        mean = ctx.op.Div(ctx.op.Add(total, start), count)
        return ctx.op.Where(ctx.op.Greater(count, scalar(ctx, 0.0, dtype)), mean, start)
    neutral = {"max": -math.inf, "min": math.inf, "sum": 0.0, "prod": 1.0}[reduce]
    reducer = {"max": ctx.op.ReduceMax, "min": ctx.op.ReduceMin, "sum": ctx.op.ReduceSum, "prod": ctx.op.ReduceProd}
    reduced = reducer[reduce](ctx.op.Where(inside, moved, scalar(ctx, neutral, dtype)), last, keepdims=0)
    if initial is None:
        return reduced
    combine = {"max": ctx.op.Max, "min": ctx.op.Min, "sum": ctx.op.Add, "prod": ctx.op.Mul}[reduce]
    return combine(scalar(ctx, float(initial), dtype), reduced)


# -------------------------------------------------------------------------------------------------- resize


def _resize_shrinks(node: gs.Node, settings: Settings) -> bool:
    """``resize`` to a size whose element count the input covers (a larger one would read uninitialised
    memory in PyTorch: no graph can match it)."""
    shape = _static(node.inputs[0])
    size = node.attrs.get("size")
    return shape is not None and size is not None and math.prod(int(s) for s in size) <= math.prod(shape)


@converter_case(lambda: Unary(lambda a: a.clone().resize_(3, 4)), inputs=[((2, 3, 2), "float32")])
@converter_case(lambda: Unary(lambda a: a.clone().resize_(5)), inputs=[((4, 3), "float32")])
def convert_resize(ctx: ConverterContext) -> gs.Tensor:
    """``aten::resize``: the first ``prod(size)`` elements of ``self`` in row-major order, in shape ``size``."""
    size = [int(s) for s in ctx.attrs["size"]]
    flat = ctx.op.Reshape(ctx.inputs[0], axes(ctx, -1))
    kept = ctx.op.Slice(flat, axes(ctx, 0), axes(ctx, math.prod(size)), axes(ctx, 0))
    return ctx.op.Reshape(kept, const(ctx, np.array(size, np.int64), "size"))


def register_more_converters(registry: ConverterRegistry) -> None:
    """Register this module's converters (and those of ``aten_losses`` and ``aten_grid3d``) on ``registry``."""
    registry.register("aten::_pdist_forward.default", validator=_pdist_static)(convert_pdist)
    registry.register("aten::put.default")(convert_put)
    registry.register("aten::rrelu_with_noise_functional.default")(convert_rrelu)
    registry.register("aten::segment_reduce.default", validator=_segments_1d)(convert_segment_reduce)
    registry.register("aten::resize.default", validator=_resize_shrinks)(convert_resize)
    register_histogram_converters(registry)
    register_loss_converters(registry)
    register_grid3d_converters(registry)
