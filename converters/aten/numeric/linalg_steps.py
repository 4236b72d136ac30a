"""Unrolled dense linear algebra on ONNX ops TensorRT takes: the building blocks of ``converters/aten/linalg.py``.

The matrix size (the last two dimensions) must be static: each algorithm is written out step by step, one group
of elementwise ops, a ``MatMul`` or a ``GatherElements`` per row or column, the same arithmetic LAPACK does
(Cholesky-Banachiewicz, Gaussian elimination with partial pivoting, forward and back substitution), so float32
results agree with PyTorch's to rounding. Batch dimensions may be dynamic. Every function takes the converter's
``ctx`` and returns graph tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from converters.context import ConverterContext

#: The largest matrix side unrolled: the graph grows with the side (a few nodes per row), the build time with it.
MAX_SIDE = 64


def static_matrix(shape: Any, *, square: bool = True) -> tuple[int, int] | None:
    """The static ``(rows, cols)`` of a ``(..., rows, cols)`` shape within ``MAX_SIDE``, or None."""
    if shape is None or len(shape) < 2:
        return None
    rows, cols = shape[-2], shape[-1]
    if not all(isinstance(d, int) and 0 < d <= MAX_SIDE for d in (rows, cols)):
        return None
    if square and rows != cols:
        return None
    return int(rows), int(cols)


def const(ctx: ConverterContext, value: Any, name: str = "const") -> gs.Constant:
    """A constant named after the node, exactly ``np.array(value)``: unlike ``ctx.constant``, a Python float stays
    float64 (callers pass arrays of the matrix's own dtype)."""
    array = np.array(value)
    return gs.Constant(ctx.fresh_name(name), array)


def axes(ctx: ConverterContext, *values: int) -> gs.Constant:
    """An int64 constant vector (axes, starts, ends) named after the node."""
    return const(ctx, np.array(values, np.int64), "axes")


def scalar(ctx: ConverterContext, value: float, dtype: Any) -> gs.Constant:
    """A 0-d constant of ``dtype`` (the dtype of the tensors it meets)."""
    return const(ctx, np.array(value, dtype=np.dtype(dtype)), "scalar")


def take(ctx: ConverterContext, x: gs.Tensor, start: int, end: int, axis: int) -> gs.Tensor:
    """``x`` sliced ``start:end`` on ``axis`` (negative axes count from the end, as in numpy)."""
    return ctx.op.Slice(x, axes(ctx, start), axes(ctx, end), axes(ctx, axis))


def swap_last(ctx: ConverterContext, x: gs.Tensor, rank: int) -> gs.Tensor:
    """``x.mT``: the last two dimensions transposed (``rank`` is ``x``'s rank)."""
    perm = [*range(rank - 2), rank - 1, rank - 2]
    return ctx.op.Transpose(x, perm=perm)


def solve_triangular(
    ctx: ConverterContext, t: gs.Tensor, b: gs.Tensor, n: int, *, lower: bool, unit: bool
) -> gs.Tensor:
    """``X`` with ``T @ X = B`` for triangular ``T`` (``(..., n, n)``) and ``B`` (``(..., n, k)``): forward
    substitution (``lower``) or back substitution, one row of ``X`` per step; batch dimensions broadcast."""
    rows: dict[int, gs.Tensor] = {}
    order = range(n) if lower else range(n - 1, -1, -1)
    for i in order:
        row = take(ctx, b, i, i + 1, -2)
        done = sorted(rows)  # the rows of X already solved, in index order
        if done:
            coefficients = take(ctx, take(ctx, t, i, i + 1, -2), done[0], done[-1] + 1, -1)
            solved = rows[done[0]] if len(done) == 1 else ctx.op.Concat(*(rows[j] for j in done), axis=-2)
            row = ctx.op.Sub(row, ctx.op.MatMul(coefficients, solved))
        if not unit:
            row = ctx.op.Div(row, take(ctx, take(ctx, t, i, i + 1, -2), i, i + 1, -1))
        rows[i] = row
    return rows[0] if n == 1 else ctx.op.Concat(*(rows[i] for i in range(n)), axis=-2)


def batch_filled(ctx: ConverterContext, like: gs.Tensor, core_rank: int, value: np.ndarray) -> gs.Tensor:
    """``value`` (int or bool, of rank <= ``core_rank``) repeated over the batch dimensions of ``like`` (all but its
    last ``core_rank``): shape ``(*like.shape[:-core_rank], *value.shape)``, built from a slice of ``like``."""
    corner = like
    for axis in range(-core_rank, 0):
        corner = take(ctx, corner, 0, 1, axis)
    same = ctx.op.Equal(corner, corner)  # True (False for NaN), shape (..., 1, ..., 1)
    zeros = ctx.op.Cast(ctx.op.And(same, ctx.op.Not(same)), to=7)
    if value.ndim < core_rank:
        zeros = ctx.op.Squeeze(zeros, axes(ctx, *range(-core_rank, -value.ndim if value.ndim else 0)))
    elif value.ndim > core_rank:
        zeros = ctx.op.Unsqueeze(zeros, axes(ctx, *range(core_rank - value.ndim, 0)))
    filled = ctx.op.Add(zeros, const(ctx, value.astype(np.int64), "value"))
    return (
        filled if value.dtype == np.int64 else ctx.op.Cast(filled, to=onnx.helper.np_dtype_to_tensor_dtype(value.dtype))
    )


def _first_failure(ctx: ConverterContext, info: gs.Tensor, failed: gs.Tensor, step: int) -> gs.Tensor:
    """``info`` with ``step + 1`` written where ``failed`` (``(..., 1, 1)``) holds and nothing failed before."""
    first = ctx.op.And(ctx.op.Squeeze(failed, axes(ctx, -1, -2)), ctx.op.Equal(info, _int32(ctx, 0)))
    return ctx.op.Where(first, _int32(ctx, step + 1), info)


def _int32(ctx: ConverterContext, value: int) -> gs.Constant:
    return const(ctx, np.array(value, np.int32), "int")


def cholesky_lower(ctx: ConverterContext, a: gs.Tensor, n: int, dtype: Any) -> tuple[gs.Tensor, gs.Tensor]:
    """``(L, info)``: the lower Cholesky factor of ``a`` (``(..., n, n)``, only its lower triangle read) and
    LAPACK's ``info`` (int32, shape ``(...)``): 0, or the order of the first leading minor that is not positive
    definite (where ``L`` holds NaN from that column on, where PyTorch raises or reports ``info``)."""
    columns: list[gs.Tensor] = []
    index = np.arange(n).reshape(n, 1)
    info = batch_filled(ctx, a, 2, np.array(0, np.int32))
    for j in range(n):
        column = take(ctx, a, j, j + 1, -1)
        if columns:
            done = columns[0] if j == 1 else ctx.op.Concat(*columns, axis=-1)
            row = take(ctx, done, j, j + 1, -2)
            column = ctx.op.Sub(column, ctx.op.ReduceSum(ctx.op.Mul(done, row), axes(ctx, -1), keepdims=1))
        pivot = take(ctx, column, j, j + 1, -2)
        root = ctx.op.Sqrt(pivot)
        scaled = ctx.op.Div(column, root)
        below = const(ctx, index > j, "below")
        on = const(ctx, index == j, "diagonal")
        columns.append(ctx.op.Where(below, scaled, ctx.op.Where(on, root, scalar(ctx, 0.0, dtype))))
        info = _first_failure(ctx, info, ctx.op.Not(ctx.op.Greater(pivot, scalar(ctx, 0.0, dtype))), j)
    factor = columns[0] if n == 1 else ctx.op.Concat(*columns, axis=-1)
    return factor, info


@dataclass(frozen=True)
class LUFactors:
    """Gaussian elimination with partial pivoting of an ``(..., m, n)`` matrix, as LAPACK's ``getrf`` returns it.

    ``packed``: U on and above the diagonal, the unit-lower L's multipliers below it; ``pivots``: int32
    ``(..., min(m, n))``, 1-based (row ``i`` was swapped with row ``pivots[i]``); ``permutation``: int64
    ``(..., m, 1)``, row ``i`` of ``L @ U`` is row ``permutation[i]`` of A; ``odd``: bool ``(..., 1, 1)``, an odd
    number of swaps; ``info``: int32 ``(...)``, 0 or the 1-based index of the first zero pivot."""

    packed: gs.Tensor
    pivots: gs.Tensor
    permutation: gs.Tensor
    odd: gs.Tensor
    info: gs.Tensor


def lu_factor(ctx: ConverterContext, a: gs.Tensor, m: int, n: int, dtype: Any, *, pivot: bool = True) -> LUFactors:
    """The LU factorization of ``a`` (``(..., m, n)``), LAPACK's unblocked ``getf2`` step by step: find the pivot
    (the first largest magnitude at or below the diagonal), swap its row up, scale the column, subtract the
    outer product from the rest. A zero pivot column is left unscaled (as LAPACK does) and reported in ``info``."""
    rows = np.arange(m).reshape(m, 1)
    cols = np.arange(n).reshape(1, n)
    permutation = batch_filled(ctx, a, 2, rows.astype(np.int64))
    odd = batch_filled(ctx, a, 2, np.zeros((1, 1), bool))
    info = batch_filled(ctx, a, 2, np.array(0, np.int32))
    pivots: list[gs.Tensor] = []
    for k in range(min(m, n)):
        if pivot:
            column = take(ctx, a, k, k + 1, -1)
            magnitude = ctx.op.Where(const(ctx, rows >= k, "candidates"), ctx.op.Abs(column), scalar(ctx, -1.0, dtype))
            chosen = ctx.op.ArgMax(magnitude, axis=-2, keepdims=1)  # (..., 1, 1): the first maximum, like idamax
            swap = swap_index(ctx, chosen, m, k)
            a = ctx.op.GatherElements(a, ctx.op.Expand(swap, ctx.op.Shape(a)), axis=-2)
            permutation = ctx.op.GatherElements(permutation, swap, axis=-2)
            odd = ctx.op.Xor(odd, ctx.op.Not(ctx.op.Equal(chosen, const(ctx, np.array(k, np.int64), "k"))))
            pivots.append(ctx.op.Cast(ctx.op.Add(chosen, const(ctx, np.array(1, np.int64), "one")), to=6))
        else:
            pivots.append(batch_filled(ctx, a, 2, np.full((1, 1), k + 1, np.int32)))
        a, info = _eliminate(ctx, a, info, rows, cols, k, dtype)
    stacked = pivots[0] if len(pivots) == 1 else ctx.op.Concat(*pivots, axis=-1)
    return LUFactors(a, ctx.op.Squeeze(stacked, axes(ctx, -2)), permutation, odd, info)


def _eliminate(
    ctx: ConverterContext, a: gs.Tensor, info: gs.Tensor, rows: np.ndarray, cols: np.ndarray, k: int, dtype: Any
) -> tuple[gs.Tensor, gs.Tensor]:
    """One elimination step below pivot ``(k, k)``: multipliers into column ``k``, the rank-1 update of the rest."""
    zero = scalar(ctx, 0.0, dtype)
    column = take(ctx, a, k, k + 1, -1)
    head = take(ctx, column, k, k + 1, -2)
    is_zero = ctx.op.Equal(head, zero)
    info = _first_failure(ctx, info, is_zero, k)
    divisor = ctx.op.Where(is_zero, scalar(ctx, 1.0, dtype), head)
    multipliers = ctx.op.Where(const(ctx, rows > k, "below"), ctx.op.Div(column, divisor), zero)
    right = ctx.op.Where(const(ctx, cols > k, "right"), take(ctx, a, k, k + 1, -2), zero)
    a = ctx.op.Sub(a, ctx.op.Mul(multipliers, right))
    return ctx.op.Where(const(ctx, (rows > k) & (cols == k), "multipliers"), multipliers, a), info


def swap_index(ctx: ConverterContext, chosen: gs.Tensor, m: int, k: int) -> gs.Tensor:
    """int64 ``(..., m, 1)``: the row order that swaps rows ``k`` and ``chosen`` (``(..., 1, 1)``), ``i`` elsewhere."""
    rows = np.arange(m, dtype=np.int64).reshape(m, 1)
    at_k = const(ctx, (rows == k).astype(np.int64), "at_k")
    at_chosen = ctx.op.Cast(ctx.op.Equal(const(ctx, rows, "rows"), chosen), to=7)
    offset = ctx.op.Sub(chosen, const(ctx, np.array(k, np.int64), "k"))
    return ctx.op.Add(const(ctx, rows, "rows"), ctx.op.Mul(ctx.op.Sub(at_k, at_chosen), offset))


def unit_lower(ctx: ConverterContext, packed: gs.Tensor, m: int, k: int, dtype: Any) -> gs.Tensor:
    """The unit-lower ``L`` (``(..., m, k)``) of an LU factorization from its packed form."""
    strict = ctx.op.Trilu(take(ctx, packed, 0, k, -1), const(ctx, np.array(-1, np.int64), "k"), upper=0)
    return ctx.op.Add(strict, const(ctx, np.eye(m, k, dtype=np.dtype(dtype)), "eye"))


def upper(ctx: ConverterContext, packed: gs.Tensor, k: int) -> gs.Tensor:
    """The upper ``U`` (``(..., k, n)``) of an LU factorization from its packed form."""
    return ctx.op.Trilu(take(ctx, packed, 0, k, -2), const(ctx, np.array(0, np.int64), "k"), upper=1)


def permutation_matrix(ctx: ConverterContext, permutation: gs.Tensor, m: int, dtype: Any) -> gs.Tensor:
    """``P`` (``(..., m, m)``) with ``A = P @ L @ U``: ``P[r, i] = 1`` where row ``i`` of ``L @ U`` is row ``r``
    of A (``permutation``: int64 ``(..., m, 1)``)."""
    as_row = ctx.op.Squeeze(ctx.op.Unsqueeze(permutation, axes(ctx, -3)), axes(ctx, -1))  # (..., 1, m)
    hits = ctx.op.Equal(as_row, const(ctx, np.arange(m, dtype=np.int64).reshape(m, 1), "rows"))
    return ctx.op.Cast(hits, to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def permutation_from_pivots(ctx: ConverterContext, pivots: gs.Tensor, m: int, k: int) -> gs.Tensor:
    """int64 ``(..., m, 1)``: the row order LAPACK's 1-based ``pivots`` (int ``(..., k)``) apply, swap by swap."""
    chosen_all = ctx.op.Sub(ctx.op.Cast(pivots, to=7), const(ctx, np.array(1, np.int64), "one"))
    permutation = batch_filled(ctx, pivots, 1, np.arange(m, dtype=np.int64).reshape(m, 1))
    for step in range(k):
        chosen = ctx.op.Unsqueeze(take(ctx, chosen_all, step, step + 1, -1), axes(ctx, -1))
        permutation = ctx.op.GatherElements(permutation, swap_index(ctx, chosen, m, step), axis=-2)
    return permutation
