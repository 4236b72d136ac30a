"""Built-in converters for the dense linear algebra the exporter cannot translate: Cholesky, LU, triangular and
general solves, inverses and determinants.

Each is the algorithm LAPACK runs, unrolled over the static matrix side (``numeric/linalg_steps.py``), so
float32 results agree with PyTorch's to rounding and TensorRT builds plain elementwise, ``MatMul`` and
``GatherElements`` layers. Validators decline what cannot be unrolled (a dynamic or large matrix side, unknown
ranks): the user then gets the registry's "no converter accepts" error naming the op. Where PyTorch raises on a
singular or non positive-definite input (``check_errors=True``), the graph cannot: the results hold NaN or inf
and ``info`` says which step failed, as with ``check_errors=False``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.aten.case_modules import Binary, Unary, spd, tri, tri_second
from converters.aten.numeric import linalg_steps as steps
from converters.aten.numeric.linalg_steps import const
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from converters.settings import Settings

# ---------------------------------------------------------------------------------------------- validators


def _shape(node: gs.Node, index: int) -> Any:
    tensor = node.inputs[index] if index < len(node.inputs) else None
    return None if tensor is None or tensor.shape is None else tuple(tensor.shape)


def square_input(node: gs.Node, settings: Settings) -> bool:
    """The first input is a batch of square matrices with a static side of at most ``MAX_SIDE``."""
    return steps.static_matrix(_shape(node, 0)) is not None


def matrix_input(node: gs.Node, settings: Settings) -> bool:
    """The first input is a batch of matrices with static sides of at most ``MAX_SIDE`` (any aspect)."""
    return steps.static_matrix(_shape(node, 0), square=False) is not None


def square_then_matrix(node: gs.Node, settings: Settings) -> bool:
    """A square first input (``A``) and a second input of known rank >= 2 (``B``)."""
    b = _shape(node, 1)
    return square_input(node, settings) and b is not None and len(b) >= 2


def matrix_then_square(node: gs.Node, settings: Settings) -> bool:
    """A first input of known rank >= 2 (``B``) and a square second input (``A``)."""
    b = _shape(node, 0)
    return b is not None and len(b) >= 2 and steps.static_matrix(_shape(node, 1)) is not None


# ---------------------------------------------------------------------------------------------- helpers


def _side(ctx: ConverterContext, index: int = 0) -> int:
    shape = ctx.input_shapes[index]
    assert shape is not None
    return int(shape[-1])


def _rank(ctx: ConverterContext, index: int) -> int:
    shape = ctx.input_shapes[index]
    assert shape is not None
    return len(shape)


def _dtype(ctx: ConverterContext, index: int = 0) -> Any:
    return ctx.input_dtypes[index] or np.dtype(np.float32)


def _eye(ctx: ConverterContext, n: int, dtype: Any) -> gs.Constant:
    return const(ctx, np.eye(n, dtype=np.dtype(dtype)), "eye")


def _solve_lu(
    ctx: ConverterContext, lu: gs.Tensor, permutation: gs.Tensor, b: gs.Tensor, n: int, *, adjoint: bool, rank: int
) -> gs.Tensor:
    """``X`` with ``A @ X = B`` (``adjoint``: ``A.mT @ X = B``) from ``A``'s LU factors; ``B`` is ``(..., n, k)``."""
    dtype = lu.dtype if lu.dtype is not None else np.float32
    if not adjoint:  # L U X = P^T B (P^T B: B's rows in pivot order; a 0/1 MatMul, which broadcasts batches)
        y = steps.solve_triangular(
            ctx, lu, ctx.op.MatMul(_pivot_order(ctx, permutation, n, dtype), b), n, lower=True, unit=True
        )
        return steps.solve_triangular(ctx, lu, y, n, lower=False, unit=False)
    t = steps.swap_last(ctx, lu, rank)  # U^T L^T P^T X = B
    y = steps.solve_triangular(ctx, t, b, n, lower=True, unit=False)
    z = steps.solve_triangular(ctx, t, y, n, lower=False, unit=True)
    return ctx.op.MatMul(steps.permutation_matrix(ctx, permutation, n, dtype), z)


def _pivot_order(ctx: ConverterContext, permutation: gs.Tensor, n: int, dtype: Any) -> gs.Tensor:
    """``P^T`` (``(..., n, n)``): ``P^T[i, r] = 1`` where row ``i`` of ``L U`` is row ``r`` of A."""
    hits = ctx.op.Equal(permutation, const(ctx, np.arange(n, dtype=np.int64).reshape(1, n), "columns"))
    return ctx.op.Cast(hits, to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


# ---------------------------------------------------------------------------------------------- Cholesky


@converter_case(lambda: Unary(torch.cholesky, spd), inputs=[((5, 5), "float32")])
@converter_case(
    lambda: Unary(lambda a: torch.cholesky(a, upper=True), spd),
    inputs=[((3, 4, 4), "float32")],
    dynamic={"a": {0: ("batch", 1, 3, 6)}},
)
def convert_cholesky(ctx: ConverterContext) -> gs.Tensor:
    """``aten::cholesky`` and ``aten::linalg_cholesky``: the Cholesky factor, column by column
    (``L[j, j] = sqrt(a[j, j] - L[j, :j] . L[j, :j])``, the column below divided by it); ``upper``: ``L.mT``."""
    factor, _ = steps.cholesky_lower(ctx, ctx.inputs[0], _side(ctx), _dtype(ctx))
    return steps.swap_last(ctx, factor, _rank(ctx, 0)) if ctx.attrs["upper"] else factor


@converter_case(lambda: Unary(lambda a: torch.linalg.cholesky_ex(a, upper=True), spd), inputs=[((2, 6, 6), "float32")])
@converter_case(
    lambda: Unary(lambda a: torch.linalg.cholesky_ex(a - 3 * torch.eye(4))[1], spd), inputs=[((4, 4), "float32")]
)
def convert_linalg_cholesky_ex(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::linalg_cholesky_ex``: ``(L, info)``; ``info`` is LAPACK's (0, or the order of the first leading
    minor that is not positive definite)."""
    factor, info = steps.cholesky_lower(ctx, ctx.inputs[0], _side(ctx), _dtype(ctx))
    if ctx.attrs["upper"]:
        factor = steps.swap_last(ctx, factor, _rank(ctx, 0))
    return [factor, info]


@converter_case(lambda: Binary(torch.cholesky_solve, tri_second), inputs=[((5, 3), "float32"), ((5, 5), "float32")])
@converter_case(
    lambda: Binary(lambda b, u: torch.cholesky_solve(b, u.mT, upper=True), tri_second),
    inputs=[((2, 4, 2), "float32"), ((2, 4, 4), "float32")],
)
def convert_cholesky_solve(ctx: ConverterContext) -> gs.Tensor:
    """``aten::cholesky_solve``: ``X`` with ``L L^T X = B`` (``U^T U X = B`` when ``upper``): two substitutions."""
    b, factor = ctx.inputs[0], ctx.inputs[1]
    n, rank = _side(ctx, 1), _rank(ctx, 1)
    lower = factor if not ctx.attrs["upper"] else steps.swap_last(ctx, factor, rank)
    y = steps.solve_triangular(ctx, lower, b, n, lower=True, unit=False)
    return steps.solve_triangular(ctx, steps.swap_last(ctx, lower, rank), y, n, lower=False, unit=False)


@converter_case(lambda: Unary(torch.cholesky_inverse, tri), inputs=[((5, 5), "float32")])
@converter_case(lambda: Unary(lambda u: torch.cholesky_inverse(u.mT, upper=True), tri), inputs=[((2, 3, 3), "float32")])
def convert_cholesky_inverse(ctx: ConverterContext) -> gs.Tensor:
    """``aten::cholesky_inverse``: ``(L L^T)^-1 = L^-T L^-1`` (``upper``: ``U^-1 U^-T``), ``L^-1`` by substitution."""
    factor, n, rank = ctx.inputs[0], _side(ctx), _rank(ctx, 0)
    lower = factor if not ctx.attrs["upper"] else steps.swap_last(ctx, factor, rank)
    inverse = steps.solve_triangular(ctx, lower, _eye(ctx, n, _dtype(ctx)), n, lower=True, unit=False)
    return ctx.op.MatMul(steps.swap_last(ctx, inverse, rank), inverse)


# ---------------------------------------------------------------------------------------------- triangular


@converter_case(
    lambda: Binary(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False), tri),
    inputs=[((4, 4), "float32"), ((4, 3), "float32")],
)
@converter_case(
    lambda: Binary(
        lambda a, b: torch.linalg.solve_triangular(a.mT, b, upper=True, left=False, unitriangular=True), tri
    ),
    inputs=[((2, 5, 5), "float32"), ((2, 3, 5), "float32")],
)
def convert_linalg_solve_triangular(ctx: ConverterContext) -> gs.Tensor:
    """``aten::linalg_solve_triangular``: substitution; ``left=False`` (``X A = B``) solves ``A^T X^T = B^T``."""
    a, b = ctx.inputs[0], ctx.inputs[1]
    n, upper, unit = _side(ctx), bool(ctx.attrs["upper"]), bool(ctx.attrs["unitriangular"])
    if ctx.attrs["left"]:
        return steps.solve_triangular(ctx, a, b, n, lower=not upper, unit=unit)
    t = steps.swap_last(ctx, a, _rank(ctx, 0))
    x = steps.solve_triangular(ctx, t, steps.swap_last(ctx, b, _rank(ctx, 1)), n, lower=upper, unit=unit)
    return steps.swap_last(ctx, x, _rank(ctx, 1))


@converter_case(
    lambda: Binary(lambda b, a: torch.triangular_solve(b, a.mT), tri_second),
    inputs=[((4, 2), "float32"), ((4, 4), "float32")],
)
@converter_case(
    lambda: Binary(lambda b, a: torch.triangular_solve(b, a, upper=False, transpose=True)[0], tri_second),
    inputs=[((3, 4, 2), "float32"), ((3, 4, 4), "float32")],
)
def convert_triangular_solve(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::triangular_solve``: ``(X, A)`` with ``A X = B`` (``transpose``: ``A^T X = B``)."""
    b, a = ctx.inputs[0], ctx.inputs[1]
    n, upper = _side(ctx, 1), bool(ctx.attrs["upper"])
    used = steps.swap_last(ctx, a, _rank(ctx, 1)) if ctx.attrs["transpose"] else a
    lower = upper if ctx.attrs["transpose"] else not upper
    x = steps.solve_triangular(ctx, used, b, n, lower=lower, unit=bool(ctx.attrs["unitriangular"]))
    return [x, ctx.op.Identity(a)]


# ---------------------------------------------------------------------------------------------- matrix_exp

#: Scaling and squaring: A / 2^s has 1-norm <= _EXP_NORM, where a degree-18 Taylor polynomial is exact to float32
#: (even at twice that norm, if rounding in log2 picks one squaring too few); at most _EXP_SQUARINGS squarings
#: (1-norms up to 1.5 * 2^24, far past where exp overflows float32 for any matrix with a positive eigenvalue).
_EXP_NORM = 3.010066362817634  # PyTorch's bound for its degree-18 polynomial: the same number of squarings
_EXP_DEGREE = 18
_EXP_SQUARINGS = 24


@converter_case(lambda: Unary(torch.linalg.matrix_exp), inputs=[((5, 5), "float32")])
@converter_case(lambda: Unary(lambda a: torch.matrix_exp(3 * a)), inputs=[((3, 4, 4), "float32")])
def convert_matrix_exp(ctx: ConverterContext) -> gs.Tensor:
    """``aten::linalg_matrix_exp`` / ``matrix_exp``: scaling and squaring. ``s = ceil(log2(|A|_1 / 1.5))``
    (per matrix, at least 0), ``exp(A / 2^s)`` by a degree-18 Taylor polynomial (Horner), then ``s`` squarings
    (a fixed number of ``MatMul`` each kept or not by ``Where``)."""
    a, n, dtype = ctx.inputs[0], _side(ctx), _dtype(ctx)
    norm = ctx.op.ReduceMax(
        ctx.op.ReduceSum(ctx.op.Abs(a), steps.axes(ctx, -2), keepdims=1), steps.axes(ctx, -1), keepdims=1
    )
    log2 = ctx.op.Div(
        ctx.op.Log(ctx.op.Div(norm, steps.scalar(ctx, _EXP_NORM, dtype))), steps.scalar(ctx, np.log(2.0), dtype)
    )
    squarings = ctx.op.Clip(ctx.op.Ceil(log2), steps.scalar(ctx, 0.0, dtype), steps.scalar(ctx, _EXP_SQUARINGS, dtype))
    scaled = ctx.op.Div(a, ctx.op.Pow(steps.scalar(ctx, 2.0, dtype), squarings))  # a power of two: exact
    eye = _eye(ctx, n, dtype)
    result = eye
    for k in range(_EXP_DEGREE, 0, -1):
        result = ctx.op.Add(eye, ctx.op.Div(ctx.op.MatMul(scaled, result), steps.scalar(ctx, float(k), dtype)))
    for i in range(_EXP_SQUARINGS):
        keep = ctx.op.Less(steps.scalar(ctx, float(i), dtype), squarings)
        result = ctx.op.Where(keep, ctx.op.MatMul(result, result), result)
    return result


def register_linalg_converters(registry: ConverterRegistry) -> None:
    """Register the Cholesky and triangular-solve converters on ``registry``, one explicit call each."""
    registry.register("aten::cholesky.default", validator=square_input)(convert_cholesky)
    registry.register("aten::linalg_cholesky.default", validator=square_input)(convert_cholesky)
    registry.register("aten::linalg_cholesky_ex.default", validator=square_input)(convert_linalg_cholesky_ex)
    registry.register("aten::cholesky_solve.default", validator=matrix_then_square)(convert_cholesky_solve)
    registry.register("aten::cholesky_inverse.default", validator=square_input)(convert_cholesky_inverse)
    registry.register("aten::linalg_solve_triangular.default", validator=square_then_matrix)(
        convert_linalg_solve_triangular
    )
    registry.register("aten::triangular_solve.default", validator=matrix_then_square)(convert_triangular_solve)
    registry.register("aten::linalg_matrix_exp.default", validator=square_input)(convert_matrix_exp)
    registry.register("aten::matrix_exp.default", validator=square_input)(convert_matrix_exp)
