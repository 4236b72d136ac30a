"""Converters that override the exporter's own translation of ATen ops it gets wrong.

The exporter translates these ops, but not as PyTorch computes them: ``avg_pool2d``/``avg_pool3d`` ignore
``divisor_override``; ``log_sigmoid`` is ``Log(Sigmoid(x))`` (``-inf`` for x below about -88, where the answer
is x); ``scatter_reduce(reduce="mean")`` scatters with no reduction (repeated indices keep one value);
``logcumsumexp`` shifts by the global maximum (a prefix far below it underflows to ``-inf``); batch norm in
training mode uses the running statistics; ``aminmax`` without ``dim`` and ``diagonal_scatter`` fail to export;
``scatter_reduce``'s ``ScatterElements`` reductions are rejected by TensorRT-RTX. Registering a converter for an
ATen op makes the exporter write it as an opaque node for the converter, so each converter here handles every
form of its op, not just the one the exporter gets wrong.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch
import torch.nn.functional as F

from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry

_INT64_MAX = np.iinfo(np.int64).max


def _ints(values: list[int] | tuple[int, ...]) -> np.ndarray:
    return np.array(list(values), np.int64)


def _scalar(ctx: ConverterContext, value: float, like: np.dtype | None) -> gs.Constant:
    return ctx.constant(np.array(value, like if like is not None else np.float32))


class _Returns(torch.nn.Module):
    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> object:
        return self.fn(x)  # type: ignore[operator]


# -- avg_pool2d / avg_pool3d ---------------------------------------------------------------------------------------


class _AvgPool(torch.nn.Module):
    def __init__(self, dims: int, **options: Any) -> None:
        super().__init__()
        self.pool = F.avg_pool2d if dims == 2 else F.avg_pool3d
        self.options = options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x, **self.options)


def _pool_geometry(ctx: ConverterContext, n: int) -> tuple[list[int], list[int], list[int]]:
    """kernel, strides, pads per spatial axis, as PyTorch reads them (``stride=[]`` is the kernel, one value for
    every axis when a single one is given)."""
    kernel = list(ctx.attrs["kernel_size"])
    kernel = kernel * n if len(kernel) == 1 else kernel
    stride = list(ctx.attrs.get("stride") or kernel)
    stride = stride * n if len(stride) == 1 else stride
    padding = list(ctx.attrs.get("padding") or [0])
    padding = padding * n if len(padding) == 1 else padding
    return kernel, stride, padding


def _ceil_extra_padding(size: int, kernel: int, stride: int, pad: int) -> int:
    """End padding that makes an unpadded-mode window count equal PyTorch's ceil_mode count."""
    out = (size + 2 * pad - kernel + stride - 1) // stride + 1
    if (out - 1) * stride >= size + pad:  # the last window may not start inside the right padding
        out -= 1
    return max(0, (out - 1) * stride + kernel - size - 2 * pad)


def pool_sizes_known(node: gs.Node, settings: object) -> bool:
    """Validator: ceil_mode with divisor_override needs static spatial sizes (the end padding depends on them)."""
    if not node.attrs.get("ceil_mode") or node.attrs.get("divisor_override") is None:
        return True
    shape = node.inputs[0].shape
    n = 3 if str(node.op).startswith("avg_pool3d") else 2
    return shape is not None and all(isinstance(d, int) for d in list(shape)[-n:])


@converter_case(
    lambda: _AvgPool(2, kernel_size=3, stride=2, padding=1, divisor_override=2), inputs=[((2, 3, 9, 8), "float32")]
)
@converter_case(
    lambda: _AvgPool(2, kernel_size=(3, 2), stride=2, padding=1, ceil_mode=True, divisor_override=5),
    inputs=[((3, 7, 7), "float32")],
)
@converter_case(
    lambda: _AvgPool(2, kernel_size=3, padding=1, count_include_pad=False), inputs=[((2, 3, 8, 8), "float32")]
)
@converter_case(
    lambda: _AvgPool(3, kernel_size=2, divisor_override=3),
    inputs=[((2, 2, 4, 4, 6), "float32")],
    dynamic={"x": {0: ("batch", 1, 2, 4)}},
)
def convert_avg_pool(ctx: ConverterContext) -> gs.Tensor:
    """``aten::avg_pool2d`` / ``aten::avg_pool3d``. With ``divisor_override`` (which the exporter ignores): the
    window sums (a convolution with a kernel of ones over ``[N*C, 1, *spatial]``) divided by the divisor, windows
    over padding and past the edge (ceil_mode) summing zeros as PyTorch does. Without it: ``AveragePool``, as the
    exporter writes it."""
    x = ctx.inputs[0]
    n = 3 if ctx.key.op_type.startswith("avg_pool3d") else 2
    kernel, strides, pads = _pool_geometry(ctx, n)
    rank = len(ctx.input_shapes[0] or ()) or n + 2
    divisor = ctx.attrs.get("divisor_override")
    if divisor is None:
        batched = x if rank == n + 2 else ctx.op.Unsqueeze(x, ctx.constant(_ints([0])))
        pooled = ctx.op.AveragePool(
            batched,
            kernel_shape=kernel,
            strides=strides,
            pads=pads + pads,
            ceil_mode=int(bool(ctx.attrs.get("ceil_mode"))),
            count_include_pad=int(bool(ctx.attrs.get("count_include_pad", True))),
        )
        return pooled if rank == n + 2 else ctx.op.Squeeze(pooled, ctx.constant(_ints([0])))
    end_pads = list(pads)
    if ctx.attrs.get("ceil_mode"):
        sizes = list(ctx.input_shapes[0] or ())[-n:]
        geometry = zip(sizes, kernel, strides, pads, strict=True)
        end_pads = [p + _ceil_extra_padding(int(s), k, st, p) for s, k, st, p in geometry]
    shape = ctx.op.Shape(x)
    spatial = ctx.op.Slice(shape, ctx.constant(_ints([-n])), ctx.constant(_ints([_INT64_MAX])))
    planes = ctx.op.Reshape(x, ctx.op.Concat(ctx.constant(_ints([-1, 1])), spatial, axis=0))
    ones = ctx.constant(np.ones([1, 1, *kernel], ctx.input_dtypes[0] or np.float32))
    sums = ctx.op.Conv(planes, ones, kernel_shape=kernel, strides=strides, pads=pads + end_pads)
    leading = ctx.op.Slice(shape, ctx.constant(_ints([0])), ctx.constant(_ints([-n])))
    out_spatial = ctx.op.Slice(ctx.op.Shape(sums), ctx.constant(_ints([-n])), ctx.constant(_ints([_INT64_MAX])))
    restored = ctx.op.Reshape(sums, ctx.op.Concat(leading, out_spatial, axis=0))
    return ctx.op.Div(restored, _scalar(ctx, float(divisor), ctx.input_dtypes[0]))


# -- log_sigmoid ---------------------------------------------------------------------------------------------------


class _LogSigmoid(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.logsigmoid(x * 50.0)  # spans -150..150: Log(Sigmoid(x)) is -inf below about -88


def log1p(ctx: ConverterContext, e: gs.Tensor, dtype: np.dtype | None) -> gs.Tensor:
    """``log(1 + e)`` to full relative precision for small ``e`` (ONNX has no Log1p): with ``u = 1 + e`` rounded,
    ``log(u) * e / (u - 1)`` cancels the rounding of ``u`` (Goldberg); where ``u == 1``, ``e`` itself."""
    one = _scalar(ctx, 1.0, dtype)
    u = ctx.op.Add(one, e)
    ratio = ctx.op.Div(ctx.op.Mul(ctx.op.Log(u), e), ctx.op.Sub(u, one))
    return ctx.op.Where(ctx.op.Equal(u, one), e, ratio)


@converter_case(_LogSigmoid, inputs=[((4, 64), "float32")])
def convert_log_sigmoid(ctx: ConverterContext) -> gs.Tensor:
    """``aten::log_sigmoid``: ``min(x, 0) - log1p(exp(-|x|))``, PyTorch's own stable form (never ``-inf`` for a
    finite x, full precision for large positive x)."""
    x = ctx.inputs[0]
    dtype = ctx.input_dtypes[0]
    e = ctx.op.Exp(ctx.op.Neg(ctx.op.Abs(x)))
    return ctx.op.Sub(ctx.op.Min(x, _scalar(ctx, 0.0, dtype)), log1p(ctx, e, dtype))


# -- scatter_reduce ------------------------------------------------------------------------------------------------


class _ScatterReduce(torch.nn.Module):
    def __init__(self, reduce: str, include_self: bool) -> None:
        super().__init__()
        self.reduce = reduce
        self.include_self = include_self
        self.index: torch.Tensor
        self.register_buffer("index", torch.tensor([[0, 1, 0, 0, 2], [3, 3, 3, 1, 3]]))  # repeated indices

    def forward(self, x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return x.scatter_reduce(1, self.index, src, self.reduce, include_self=self.include_self)


_REDUCTIONS = {"sum": "ReduceSum", "mean": "ReduceSum", "prod": "ReduceProd", "amax": "ReduceMax", "amin": "ReduceMin"}
_COMBINE = {"sum": "Add", "mean": "Add", "prod": "Mul", "amax": "Max", "amin": "Min"}


def _identity(reduce: str, dtype: np.dtype) -> np.ndarray:
    """The value that leaves a reduction unchanged."""
    if reduce in ("sum", "mean"):
        return np.array(0, dtype)
    if reduce == "prod":
        return np.array(1, dtype)
    if dtype.kind == "f":
        return np.array(-np.inf if reduce == "amax" else np.inf, dtype)
    info = np.iinfo(dtype)
    return np.array(info.min if reduce == "amax" else info.max, dtype)


def _known_reduction(node: gs.Node, settings: object) -> bool:
    """A reduction PyTorch defines, on a float or integer tensor (not bool)."""
    reduce = node.attrs.get("reduce")
    dtype = node.inputs[0].dtype
    numeric = dtype is None or np.dtype(dtype).kind in "fiu"
    return numeric and (reduce.decode() if isinstance(reduce, bytes) else reduce) in _REDUCTIONS


@converter_case(lambda: _ScatterReduce("mean", True), inputs=[((2, 4), "float32"), ((2, 6), "float32")])
@converter_case(lambda: _ScatterReduce("mean", False), inputs=[((3, 5), "float32"), ((2, 5), "float32")])
@converter_case(lambda: _ScatterReduce("amax", False), inputs=[((2, 4), "float32"), ((2, 5), "float32")])
@converter_case(lambda: _ScatterReduce("prod", True), inputs=[((2, 4), "float32"), ((2, 5), "float32")])
def convert_scatter_reduce(ctx: ConverterContext) -> gs.Tensor:
    """``aten::scatter_reduce.two`` without ``ScatterElements`` (TensorRT-RTX takes no scatter reduction; the
    exporter's ``mean`` scatters without reducing): along ``dim`` (moved last), every index is compared with every
    target position, ``[..., m, n]``, the values spread there (the reduction's identity elsewhere) are reduced over
    ``m``, and combined with ``self`` (``include_self``) or replace it where anything was scattered. ``mean``
    divides by the count per position (plus one with ``self``; floor division for integers, as PyTorch). Costs
    an ``m x n`` temporary per row (m indices, n positions along ``dim``)."""
    data, index, src = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    reduce, include_self = str(ctx.attrs["reduce"]), bool(ctx.attrs["include_self"])
    dtype = np.dtype(ctx.input_dtypes[0] or np.float32)
    rank = len(ctx.input_shapes[0] or ())
    if rank == 0:  # one position, one value
        flat = ctx.constant(_ints([1]))
        data, index, src = (ctx.op.Reshape(t, flat) for t in (data, index, src))
    rank = max(rank, 1)
    axis = int(ctx.attrs["dim"]) % rank
    perm = [a for a in range(rank) if a != axis] + [axis]

    def moved(t: gs.Tensor) -> gs.Tensor:
        return t if axis == rank - 1 else ctx.op.Transpose(t, perm=perm)

    index_shape = ctx.op.Shape(index)
    cut = ctx.op.Slice(src, ctx.constant(np.zeros(rank, np.int64)), index_shape, ctx.constant(np.arange(rank)))
    target, index, src = moved(data), moved(index), moved(cut)
    length = (ctx.input_shapes[0] or (1,))[axis]
    hits = ctx.op.Equal(ctx.op.Unsqueeze(index, ctx.constant(_ints([-1]))), _positions(ctx, target, length))
    identity = ctx.constant(_identity(reduce, dtype))
    spread = ctx.op.Where(hits, ctx.op.Unsqueeze(src, ctx.constant(_ints([-1]))), identity)
    over_m = ctx.constant(_ints([-2]))
    reduced = _pad_to(ctx, getattr(ctx.op, _REDUCTIONS[reduce])(spread, over_m, keepdims=0), target, identity)
    counts = None
    if reduce == "mean" or not include_self:
        counts = ctx.op.ReduceSum(ctx.op.Cast(hits, to=onnx.helper.np_dtype_to_tensor_dtype(dtype)), over_m, keepdims=0)
        counts = _pad_to(ctx, counts, target, ctx.constant(np.array(0, dtype)))
    value = getattr(ctx.op, _COMBINE[reduce])(target, reduced) if include_self else reduced
    if reduce == "mean":
        one = ctx.constant(np.array(1, dtype))
        value = _divide(ctx, value, ctx.op.Add(counts, one) if include_self else ctx.op.Max(counts, one), dtype)
    if not include_self:
        value = ctx.op.Where(ctx.op.Greater(counts, ctx.constant(np.array(0, dtype))), value, target)
    if axis != rank - 1:
        value = ctx.op.Transpose(value, perm=[int(a) for a in np.argsort(perm)])
    return ctx.op.Reshape(value, ctx.constant(np.zeros(0, np.int64))) if ctx.input_shapes[0] == () else value


def _positions(ctx: ConverterContext, x: gs.Tensor, length: int | str | None) -> gs.Tensor:
    """``0, 1, ..., n-1`` (int64) for the last axis of ``x``: a constant for a static length."""
    if isinstance(length, int):
        return ctx.constant(np.arange(length, dtype=np.int64))
    size = ctx.op.Reshape(
        ctx.op.Slice(ctx.op.Shape(x), ctx.constant(_ints([-1])), ctx.constant(_ints([_INT64_MAX]))),
        ctx.constant(np.zeros(0, np.int64)),
    )
    return ctx.op.Range(ctx.constant(np.array(0, np.int64)), size, ctx.constant(np.array(1, np.int64)))


def _pad_to(ctx: ConverterContext, x: gs.Tensor, like: gs.Tensor, fill: gs.Constant) -> gs.Tensor:
    """``x`` padded at the end of each axis with ``fill`` to the shape of ``like`` (an index may be smaller than
    ``self`` on the axes other than ``dim``)."""
    ends = ctx.op.Sub(ctx.op.Shape(like), ctx.op.Shape(x))
    pads = ctx.op.Concat(ctx.op.Mul(ends, ctx.constant(np.array(0, np.int64))), ends, axis=0)
    return ctx.op.Pad(x, pads, fill)


def _divide(ctx: ConverterContext, a: gs.Tensor, b: gs.Tensor, dtype: np.dtype) -> gs.Tensor:
    """``a / b``; for integers PyTorch's floor division, ``(a - a mod b) / b`` with a Python-style mod."""
    if dtype.kind == "f":
        return ctx.op.Div(a, b)
    return ctx.op.Div(ctx.op.Sub(a, ctx.op.Mod(a, b, fmod=0)), b)


# -- logcumsumexp --------------------------------------------------------------------------------------------------


class _LogCumSumExp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a prefix 200 below the row's maximum: shifting by the global maximum underflows it to -inf
        return torch.logcumsumexp(torch.cat([x - 200.0, x + 1.0], dim=1), dim=1)


@converter_case(_LogCumSumExp, inputs=[((3, 6), "float32")])
@converter_case(
    lambda: _Returns(lambda x: torch.logcumsumexp(x, 0)),
    inputs=[((7, 2, 3), "float32")],
    dynamic={"x": {0: ("n", 2, 7, 9)}},
)
def convert_logcumsumexp(ctx: ConverterContext) -> gs.Tensor:
    """``aten::logcumsumexp``: ``out[i] = m[i] + log(sum_{j<=i} exp(x[j] - m[i]))`` with ``m`` the running
    maximum, from an ``n x n`` lower-triangular mask along ``dim`` (n = its length): exact wherever PyTorch is (no
    prefix underflows), at the cost of an ``n``-times larger temporary."""
    x = ctx.inputs[0]
    rank = len(ctx.input_shapes[0] or ())
    if rank == 0:
        return ctx.op.Identity(x)
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    axis = int(ctx.attrs["dim"]) % rank
    perm = [a for a in range(rank) if a != axis] + [axis]
    moved = x if axis == rank - 1 else ctx.op.Transpose(x, perm=perm)
    mask = _lower_triangle(ctx, moved, (ctx.input_shapes[0] or ())[axis])  # [i, j]: j <= i
    values = ctx.op.Unsqueeze(moved, ctx.constant(_ints([-2])))  # [..., 1, n(j)]
    running = ctx.op.ReduceMax(
        ctx.op.Where(mask, values, _scalar(ctx, -math.inf, dtype)), ctx.constant(_ints([-1])), keepdims=1
    )
    # an infinite running maximum (all -inf so far, or +inf) shifts by 0: the sum is then 0 or inf, as in PyTorch
    shift = ctx.op.Where(ctx.op.IsInf(running), _scalar(ctx, 0.0, dtype), running)
    terms = ctx.op.Where(mask, ctx.op.Exp(ctx.op.Sub(values, shift)), _scalar(ctx, 0.0, dtype))
    total = ctx.op.ReduceSum(terms, ctx.constant(_ints([-1])), keepdims=0)
    out = ctx.op.Add(ctx.op.Log(total), ctx.op.Squeeze(shift, ctx.constant(_ints([-1]))))
    return out if axis == rank - 1 else ctx.op.Transpose(out, perm=[int(a) for a in np.argsort(perm)])


def _lower_triangle(ctx: ConverterContext, x: gs.Tensor, length: int | str | None) -> gs.Tensor:
    """The boolean ``[n, n]`` mask ``j <= i`` for the last axis of ``x``: a constant for a static length."""
    if isinstance(length, int):
        return ctx.constant(np.tril(np.ones((length, length), np.bool_)))
    positions = _positions(ctx, x, length)
    rows = ctx.op.Unsqueeze(positions, ctx.constant(_ints([1])))
    cols = ctx.op.Unsqueeze(positions, ctx.constant(_ints([0])))
    return ctx.op.LessOrEqual(cols, rows)


# -- aminmax -------------------------------------------------------------------------------------------------------


@converter_case(lambda: _Returns(lambda x: tuple(torch.aminmax(x))), inputs=[((3, 5), "float32")])
@converter_case(lambda: _Returns(lambda x: tuple(torch.aminmax(x, dim=1, keepdim=True))), inputs=[((3, 5), "float32")])
def convert_aminmax(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::aminmax``: ``ReduceMin`` and ``ReduceMax`` over ``dim``, or over every axis when ``dim`` is None
    (which the exporter fails to translate)."""
    x = ctx.inputs[0]
    dim, keepdim = ctx.attrs.get("dim"), int(bool(ctx.attrs.get("keepdim")))
    if len(ctx.input_shapes[0] or ()) == 0:
        return [ctx.op.Identity(x), ctx.op.Identity(x)]
    if dim is None:
        return [ctx.op.ReduceMin(x, keepdims=keepdim), ctx.op.ReduceMax(x, keepdims=keepdim)]
    axes = ctx.constant(_ints([int(dim)]))
    return [ctx.op.ReduceMin(x, axes, keepdims=keepdim), ctx.op.ReduceMax(x, axes, keepdims=keepdim)]


# -- batch norm in training mode ----------------------------------------------------------------------------------


class _BatchNormTraining(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))
        self.bias = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 4))

    def forward(self, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        stats = (mean.clone(), var.abs() + 0.5)
        return F.batch_norm(x, *stats, self.weight, self.bias, training=True, momentum=0.3, eps=0.1)


@converter_case(_BatchNormTraining, inputs=[((3, 4, 5), "float32"), ((4,), "float32"), ((4,), "float32")])
def convert_batch_norm_functional(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::_native_batch_norm_legit_functional``. In training mode (``F.batch_norm(training=True)``, which
    the exporter translates as inference with the running statistics) the statistics of the batch over every axis
    but 1: output, saved mean and 1/std, and the updated running mean and (unbiased) variance."""
    x, weight, bias, running_mean, running_var = ctx.inputs[:5]
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    if dtype.itemsize < 4:  # half types: statistics in float32, as PyTorch computes them
        dtype = np.dtype(np.float32)
        x, weight, bias, running_mean, running_var = (
            None if t is None else ctx.op.Cast(t, to=onnx.TensorProto.FLOAT) for t in ctx.inputs[:5]
        )
    rank = len(ctx.input_shapes[0] or ())
    eps, momentum = float(ctx.attrs["eps"]), float(ctx.attrs["momentum"])
    per_channel = ctx.constant(_ints([1, -1] + [1] * (rank - 2)))
    flat = ctx.constant(_ints([-1]))
    if ctx.attrs["training"]:
        axes = ctx.constant(_ints([0, *range(2, rank)]))
        mean = ctx.op.ReduceMean(x, axes, keepdims=1)
        centered = ctx.op.Sub(x, mean)
        var = ctx.op.ReduceMean(ctx.op.Mul(centered, centered), axes, keepdims=1)
    else:
        mean, var = ctx.op.Reshape(running_mean, per_channel), ctx.op.Reshape(running_var, per_channel)
        centered = ctx.op.Sub(x, mean)
    rstd = ctx.op.Reciprocal(ctx.op.Sqrt(ctx.op.Add(var, _scalar(ctx, eps, dtype))))
    out = ctx.op.Mul(centered, rstd)
    if weight is not None:
        out = ctx.op.Mul(out, ctx.op.Reshape(weight, per_channel))
    if bias is not None:
        out = ctx.op.Add(out, ctx.op.Reshape(bias, per_channel))
    if not ctx.attrs["training"]:
        empty = np.zeros(0, dtype)
        stats = [ctx.constant(empty), ctx.constant(empty), ctx.op.Identity(running_mean), ctx.op.Identity(running_var)]
        return _as_declared(ctx, [out, *stats], dtype)
    # n / (n - 1) computed in float32 (n itself may exceed float16's range), then in the input's type
    count = ctx.op.Cast(
        ctx.op.Div(ctx.op.Size(x), ctx.op.Gather(ctx.op.Shape(x), ctx.constant(np.array(1, np.int64)))),
        to=onnx.TensorProto.FLOAT,
    )
    ratio = ctx.op.Div(count, ctx.op.Sub(count, ctx.constant(np.array(1.0, np.float32))))
    ratio = ctx.op.Cast(ratio, to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    unbiased = ctx.op.Mul(ctx.op.Reshape(var, flat), ratio)
    keep, take = _scalar(ctx, 1.0 - momentum, dtype), _scalar(ctx, momentum, dtype)
    save_mean = ctx.op.Reshape(mean, flat)
    new_mean = ctx.op.Add(ctx.op.Mul(running_mean, keep), ctx.op.Mul(save_mean, take))
    new_var = ctx.op.Add(ctx.op.Mul(running_var, keep), ctx.op.Mul(unbiased, take))
    return _as_declared(ctx, [out, save_mean, ctx.op.Reshape(rstd, flat), new_mean, new_var], dtype)


def _as_declared(ctx: ConverterContext, outputs: list[gs.Tensor], computed: np.dtype) -> list[gs.Tensor]:
    """Each output in the type the node declares for it (float32 statistics of a float16 input, ...)."""
    cast: list[gs.Tensor] = []
    for value, declared in zip(outputs, ctx.node.outputs, strict=True):
        if declared.dtype is None or np.dtype(declared.dtype) == computed:
            cast.append(value)
        elif isinstance(value, gs.Constant):
            cast.append(ctx.constant(value.values.astype(declared.dtype)))
        else:
            cast.append(ctx.op.Cast(value, to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(declared.dtype))))
    return cast


# -- diagonal_scatter ----------------------------------------------------------------------------------------------


def diagonal_sizes_known(node: gs.Node, settings: object) -> bool:
    """Validator: the two axes that hold the diagonal have static sizes (the diagonal's map is a constant)."""
    shape = node.inputs[0].shape
    if shape is None:
        return False
    rank = len(shape)
    dims = (int(node.attrs.get("dim1", 0)) % max(rank, 1), int(node.attrs.get("dim2", 1)) % max(rank, 1))
    return rank >= 2 and all(isinstance(shape[d], int) for d in dims)


@converter_case(lambda: _Returns(lambda x: torch.diagonal_scatter(x, x[0, :4] * 10)), inputs=[((6, 4), "float32")])
@converter_case(
    lambda: _Returns(lambda x: torch.diagonal_scatter(x, x[:, 0, :3] + 7, offset=-1, dim1=2, dim2=1)),
    inputs=[((2, 3, 4), "float32")],
)
def convert_diagonal_scatter(ctx: ConverterContext) -> gs.Tensor:
    """``aten::diagonal_scatter`` (whose decomposition the exporter fails on): ``src``'s last axis gathered onto
    the ``(dim1, dim2)`` plane by a constant index map, moved into place, and selected on the diagonal."""
    x, src = ctx.inputs[0], ctx.inputs[1]
    shape = list(ctx.input_shapes[0] or ())
    rank = len(shape)
    d1, d2, offset = int(ctx.attrs["dim1"]) % rank, int(ctx.attrs["dim2"]) % rank, int(ctx.attrs["offset"])
    rows, cols = np.indices((int(shape[d1]), int(shape[d2])))
    on_diagonal = cols - rows == offset
    position = np.minimum(rows, cols) if offset == 0 else (rows if offset > 0 else cols)
    position = np.where(on_diagonal, position, 0).astype(np.int64)
    gathered = ctx.op.Gather(src, ctx.constant(position), axis=-1)  # [other axes..., size d1, size d2]
    order = [a for a in range(rank) if a not in (d1, d2)] + [d1, d2]
    placed = ctx.op.Transpose(gathered, perm=[order.index(a) for a in range(rank)])
    mask_shape = [1] * rank
    mask_shape[d1], mask_shape[d2] = int(shape[d1]), int(shape[d2])
    mask = on_diagonal if d1 < d2 else on_diagonal.T
    return ctx.op.Where(ctx.constant(mask.reshape(mask_shape)), placed, x)


def register_override_converters(registry: ConverterRegistry) -> None:
    """Register the converters that replace the exporter's translation of these ATen ops, one call each."""
    registry.register("aten::avg_pool2d.default", validator=pool_sizes_known)(convert_avg_pool)
    registry.register("aten::avg_pool3d.default", validator=pool_sizes_known)(convert_avg_pool)
    registry.register("aten::log_sigmoid.default")(convert_log_sigmoid)
    registry.register("aten::scatter_reduce.two", validator=_known_reduction)(convert_scatter_reduce)
    registry.register("aten::logcumsumexp.default")(convert_logcumsumexp)
    registry.register("aten::aminmax.default")(convert_aminmax)
    registry.register("aten::_native_batch_norm_legit_functional.default")(convert_batch_norm_functional)
    registry.register("aten::diagonal_scatter.default", validator=diagonal_sizes_known)(convert_diagonal_scatter)
