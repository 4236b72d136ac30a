"""Built-in converters for everything PyTorch computes from an LU factorization with partial pivoting: the
factorization itself (``linalg_lu_factor``, ``linalg_lu``, ``lu_unpack``), solves (``linalg_solve``,
``linalg_lu_solve``, ``lu_solve``), inverses and determinants (``linalg_inv``, ``linalg_det``, ``logdet``,
``linalg_slogdet``).

The factorization is LAPACK's ``getf2``, unrolled over the static matrix side (``numeric/linalg_steps.py``);
validators decline dynamic or large sides and unknown ranks. A singular input gives inf or NaN where PyTorch
(with ``check_errors``) would raise; ``info`` reports the first zero pivot as LAPACK does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.aten.case_modules import Binary, Unary, regular
from converters.aten.linalg import matrix_input, square_input
from converters.aten.numeric import linalg_steps as steps
from converters.aten.numeric.linalg_steps import const
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from converters.settings import Settings


def _shape(tensor: gs.Tensor | None) -> tuple[Any, ...] | None:
    return None if tensor is None or tensor.shape is None else tuple(tensor.shape)


def _dims(ctx: ConverterContext, index: int = 0) -> tuple[int, int, int]:
    """``(rows, cols, rank)`` of input ``index`` (static sides, checked by the validator)."""
    shape = ctx.input_shapes[index]
    assert shape is not None
    return int(shape[-2]), int(shape[-1]), len(shape)


def _dtype(ctx: ConverterContext, index: int = 0) -> Any:
    return ctx.input_dtypes[index] or np.dtype(np.float32)


def _onnx_type(dtype: Any) -> int:
    return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _diagonal(ctx: ConverterContext, packed: gs.Tensor, n: int, dtype: Any) -> gs.Tensor:
    """The diagonal ``(..., n)`` of a square ``(..., n, n)`` (a masked sum: exact, only zeros are added)."""
    masked = ctx.op.Mul(packed, const(ctx, np.eye(n, dtype=np.dtype(dtype)), "eye"))
    return ctx.op.ReduceSum(masked, steps.axes(ctx, -1), keepdims=0)


def _pivot_order(ctx: ConverterContext, permutation: gs.Tensor, n: int, dtype: Any) -> gs.Tensor:
    """``P^T`` (``(..., n, n)``) for a row order ``permutation`` (int64 ``(..., n, 1)``): ``P^T @ B`` takes B's
    rows in that order (a 0/1 ``MatMul``: exact for finite B, and it broadcasts batches)."""
    hits = ctx.op.Equal(permutation, const(ctx, np.arange(n, dtype=np.int64).reshape(1, n), "columns"))
    return ctx.op.Cast(hits, to=_onnx_type(dtype))


def _solve_factored(
    ctx: ConverterContext, lu: gs.Tensor, permutation: gs.Tensor, b: gs.Tensor, n: int, dtype: Any, *, adjoint: bool
) -> gs.Tensor:
    """``X`` with ``A X = B`` (``adjoint``: ``A^T X = B``) from ``A = P L U``; ``B`` is ``(..., n, k)``."""
    if not adjoint:  # L U X = P^T B
        permuted = ctx.op.MatMul(_pivot_order(ctx, permutation, n, dtype), b)
        y = steps.solve_triangular(ctx, lu, permuted, n, lower=True, unit=True)
        return steps.solve_triangular(ctx, lu, y, n, lower=False, unit=False)
    rank = len(lu.shape) if lu.shape is not None else 2
    t = steps.swap_last(ctx, lu, rank)  # U^T L^T P^T X = B
    y = steps.solve_triangular(ctx, t, b, n, lower=True, unit=False)
    z = steps.solve_triangular(ctx, t, y, n, lower=False, unit=True)
    return ctx.op.MatMul(steps.permutation_matrix(ctx, permutation, n, dtype), z)


# ---------------------------------------------------------------------------------------------- factorization


@converter_case(lambda: Unary(lambda a: torch.linalg.lu_factor(a)), inputs=[((5, 5), "float32")])
@converter_case(
    lambda: Unary(lambda a: torch.linalg.lu_factor_ex(a)),
    inputs=[((2, 4, 6), "float32")],
    dynamic={"a": {0: ("batch", 1, 2, 4)}},
)
@converter_case(lambda: Unary(lambda a: torch.linalg.lu_factor_ex(a)), inputs=[((6, 3), "float32")])
def convert_lu_factor(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::linalg_lu_factor`` / ``linalg_lu_factor_ex`` / ``_lu_with_info``: ``(LU, pivots[, info])``, LAPACK's
    packed factors and 1-based int32 pivots."""
    m, n, _ = _dims(ctx)
    factors = steps.lu_factor(ctx, ctx.inputs[0], m, n, _dtype(ctx), pivot=bool(ctx.attrs.get("pivot", True)))
    outputs = [factors.packed, factors.pivots, factors.info]
    return outputs[: len(ctx.node.outputs)]


@converter_case(lambda: Unary(lambda a: torch.linalg.lu(a)), inputs=[((4, 4), "float32")])
@converter_case(lambda: Unary(lambda a: torch.linalg.lu(a)), inputs=[((2, 3, 5), "float32")])
@converter_case(lambda: Unary(lambda a: torch.linalg.lu(a)), inputs=[((5, 3), "float32")])
def convert_linalg_lu(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::linalg_lu``: ``(P, L, U)`` with ``A = P L U``."""
    m, n, _ = _dims(ctx)
    dtype = _dtype(ctx)
    factors = steps.lu_factor(ctx, ctx.inputs[0], m, n, dtype, pivot=bool(ctx.attrs["pivot"]))
    k = min(m, n)
    p = steps.permutation_matrix(ctx, factors.permutation, m, dtype)
    return [p, steps.unit_lower(ctx, factors.packed, m, k, dtype), steps.upper(ctx, factors.packed, k)]


def unpacks_all(node: gs.Node, settings: Settings) -> bool:
    """``lu_unpack`` with static LU sides and both ``unpack_data`` and ``unpack_pivots`` (empty outputs
    otherwise, which a TensorRT graph cannot return)."""
    keeps = all(bool(node.attrs.get(name, 1)) for name in ("unpack_data", "unpack_pivots"))
    return keeps and matrix_input(node, settings)


@converter_case(lambda: Unary(lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a))), inputs=[((2, 5, 4), "float32")])
def convert_lu_unpack(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::lu_unpack``: ``(P, L, U)`` from packed factors and 1-based pivots (applied swap by swap)."""
    m, n, _ = _dims(ctx)
    k, dtype = min(m, n), _dtype(ctx)
    permutation = steps.permutation_from_pivots(ctx, ctx.inputs[1], m, k)
    p = steps.permutation_matrix(ctx, permutation, m, dtype)
    packed = ctx.inputs[0]
    return [p, steps.unit_lower(ctx, packed, m, k, dtype), steps.upper(ctx, packed, k)]


# ---------------------------------------------------------------------------------------------- solves


def _is_vector_rhs(a_shape: tuple[Any, ...], b_shape: tuple[Any, ...]) -> bool:
    """PyTorch's rule: B is a batch of vectors when it is 1-D or has A's shape without its last dimension."""
    return len(b_shape) == 1 or (len(b_shape) == len(a_shape) - 1 and b_shape == a_shape[:-1])


def solvable(node: gs.Node, settings: Settings) -> bool:
    """A square ``A`` (static side) and a ``B`` of known shape."""
    return square_input(node, settings) and _shape(node.inputs[1] if len(node.inputs) > 1 else None) is not None


@converter_case(lambda: Binary(torch.linalg.solve, regular), inputs=[((5, 5), "float32"), ((5, 3), "float32")])
@converter_case(lambda: Binary(torch.linalg.solve, regular), inputs=[((2, 4, 4), "float32"), ((2, 4), "float32")])
@converter_case(
    lambda: Binary(lambda a, b: torch.linalg.solve_ex(a, b, left=False), regular),
    inputs=[((3, 3), "float32"), ((2, 3), "float32")],
)
def convert_linalg_solve(ctx: ConverterContext) -> Any:
    """``aten::linalg_solve`` / ``linalg_solve_ex``: ``X`` with ``A X = B`` (``left=False``: ``X A = B``, that is
    ``A^T X^T = B^T``) by LU with partial pivoting; a vector ``B`` is solved as one column."""
    n, _, rank = _dims(ctx)
    dtype = _dtype(ctx)
    a, b = ctx.inputs[0], ctx.inputs[1]
    a_shape, b_shape = ctx.input_shapes[0], ctx.input_shapes[1]
    assert a_shape is not None and b_shape is not None
    vector = _is_vector_rhs(a_shape, b_shape)
    left = bool(ctx.attrs.get("left", True))
    columns = ctx.op.Unsqueeze(b, steps.axes(ctx, -1)) if vector else b
    if not left and not vector:
        columns = steps.swap_last(ctx, columns, len(b_shape))
    factors = steps.lu_factor(ctx, a, n, n, dtype)
    x = _solve_factored(ctx, factors.packed, factors.permutation, columns, n, dtype, adjoint=not left)
    if vector:
        x = ctx.op.Squeeze(x, steps.axes(ctx, -1))
    elif not left:
        x = steps.swap_last(ctx, x, len(b_shape))
    return [x, factors.info] if len(ctx.node.outputs) == 2 else x


def _lu_solvable(node: gs.Node, settings: Settings) -> bool:
    lu = _shape(node.inputs[0])
    b = _shape(node.inputs[2]) if len(node.inputs) > 2 else None
    return steps.static_matrix(lu) is not None and b is not None and len(b) >= 2


@converter_case(
    lambda: Binary(lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b), regular),
    inputs=[((4, 4), "float32"), ((4, 2), "float32")],
)
@converter_case(
    lambda: Binary(lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, adjoint=True), regular),
    inputs=[((4, 4), "float32"), ((4, 2), "float32")],
)
@converter_case(
    lambda: Binary(lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, left=False), regular),
    inputs=[((2, 3, 3), "float32"), ((2, 4, 3), "float32")],
)
def convert_linalg_lu_solve(ctx: ConverterContext) -> gs.Tensor:
    """``aten::linalg_lu_solve``: ``X`` from packed LU factors; ``left=False`` solves ``X A = B``, ``adjoint``
    ``A^T``."""
    n, _, _ = _dims(ctx)
    dtype = _dtype(ctx)
    lu, pivots, b = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    b_rank = len(ctx.input_shapes[2] or ())
    permutation = steps.permutation_from_pivots(ctx, pivots, n, n)
    left, adjoint = bool(ctx.attrs["left"]), bool(ctx.attrs["adjoint"])
    if left:
        return _solve_factored(ctx, lu, permutation, b, n, dtype, adjoint=adjoint)
    x = _solve_factored(ctx, lu, permutation, steps.swap_last(ctx, b, b_rank), n, dtype, adjoint=not adjoint)
    return steps.swap_last(ctx, x, b_rank)


def _old_lu_solvable(node: gs.Node, settings: Settings) -> bool:
    b = _shape(node.inputs[0])
    return steps.static_matrix(_shape(node.inputs[1])) is not None and b is not None and len(b) >= 2


@converter_case(
    lambda: Binary(lambda b, a: torch.lu_solve(b, *torch.linalg.lu_factor(a)), lambda b, a: (b, *regular(a))),
    inputs=[((4, 3), "float32"), ((4, 4), "float32")],
)
def convert_lu_solve(ctx: ConverterContext) -> gs.Tensor:
    """``aten::lu_solve`` (``torch.lu_solve(B, LU, pivots)``): ``X`` with ``A X = B``."""
    n, _, _ = _dims(ctx, 1)
    permutation = steps.permutation_from_pivots(ctx, ctx.inputs[2], n, n)
    return _solve_factored(ctx, ctx.inputs[1], permutation, ctx.inputs[0], n, _dtype(ctx, 1), adjoint=False)


# ---------------------------------------------------------------------------------------------- inverse, det


@converter_case(lambda: Unary(torch.linalg.inv, regular), inputs=[((5, 5), "float32")])
@converter_case(lambda: Unary(torch.linalg.inv_ex, regular), inputs=[((3, 4, 4), "float32")])
def convert_linalg_inv(ctx: ConverterContext) -> Any:
    """``aten::linalg_inv`` / ``linalg_inv_ex`` / ``inverse``: ``A^-1`` solving ``A X = I`` by LU with partial
    pivoting (``info``: the first zero pivot)."""
    n, _, _ = _dims(ctx)
    dtype = _dtype(ctx)
    factors = steps.lu_factor(ctx, ctx.inputs[0], n, n, dtype)
    permuted = _pivot_order(ctx, factors.permutation, n, dtype)  # P^T I
    y = steps.solve_triangular(ctx, factors.packed, permuted, n, lower=True, unit=True)
    inverse = steps.solve_triangular(ctx, factors.packed, y, n, lower=False, unit=False)
    return [inverse, factors.info] if len(ctx.node.outputs) == 2 else inverse


def _signed_diagonal(ctx: ConverterContext) -> tuple[gs.Tensor, gs.Tensor, Any]:
    """``(diagonal of U, odd number of swaps (..., ), dtype)`` of the first input's LU factorization."""
    n, _, _ = _dims(ctx)
    dtype = _dtype(ctx)
    factors = steps.lu_factor(ctx, ctx.inputs[0], n, n, dtype)
    odd = ctx.op.Squeeze(factors.odd, steps.axes(ctx, -1, -2))
    return _diagonal(ctx, factors.packed, n, dtype), odd, dtype


@converter_case(lambda: Unary(torch.linalg.det), inputs=[((5, 5), "float32")])
@converter_case(lambda: Unary(torch.det), inputs=[((2, 3, 3), "float32")], dynamic={"a": {0: ("batch", 1, 2, 4)}})
def convert_linalg_det(ctx: ConverterContext) -> gs.Tensor:
    """``aten::linalg_det`` / ``det``: the product of U's diagonal, negated for an odd number of row swaps."""
    diagonal, odd, _ = _signed_diagonal(ctx)
    product = ctx.op.ReduceProd(diagonal, steps.axes(ctx, -1), keepdims=0)
    return ctx.op.Where(odd, ctx.op.Neg(product), product)


def _sign_and_log(ctx: ConverterContext) -> tuple[gs.Tensor, gs.Tensor, Any]:
    diagonal, odd, dtype = _signed_diagonal(ctx)
    sign = ctx.op.ReduceProd(ctx.op.Sign(diagonal), steps.axes(ctx, -1), keepdims=0)
    sign = ctx.op.Where(odd, ctx.op.Neg(sign), sign)
    log_abs = ctx.op.ReduceSum(ctx.op.Log(ctx.op.Abs(diagonal)), steps.axes(ctx, -1), keepdims=0)
    return sign, log_abs, dtype


@converter_case(lambda: Unary(torch.linalg.slogdet), inputs=[((5, 5), "float32")])
@converter_case(lambda: Unary(torch.linalg.slogdet), inputs=[((3, 4, 4), "float32")])
def convert_linalg_slogdet(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::linalg_slogdet``: ``(sign, log|det|)`` from U's diagonal (0 and -inf for a singular matrix)."""
    sign, log_abs, _ = _sign_and_log(ctx)
    return [sign, log_abs]


@converter_case(lambda: Unary(torch.logdet, lambda a: (a @ a.mT + torch.eye(4),)), inputs=[((4, 4), "float32")])
@converter_case(lambda: Unary(torch.logdet, lambda a: (a @ a.mT + torch.eye(3),)), inputs=[((3, 3, 3), "float32")])
def convert_logdet(ctx: ConverterContext) -> gs.Tensor:
    """``aten::logdet``: ``log(det)``: NaN for a negative determinant, -inf for zero, as PyTorch."""
    sign, log_abs, dtype = _sign_and_log(ctx)
    negative = ctx.op.Less(sign, steps.scalar(ctx, 0.0, dtype))
    return ctx.op.Where(negative, steps.scalar(ctx, float("nan"), dtype), log_abs)


def tensor_invertible(node: gs.Node, settings: Settings) -> bool:
    """``linalg_tensorinv`` of a static shape whose first ``ind`` dimensions multiply to the product of the
    rest, within ``MAX_SIDE``."""
    shape, ind = _shape(node.inputs[0]), int(node.attrs.get("ind", 2))
    if shape is None or not all(isinstance(d, int) for d in shape) or not 0 < ind < len(shape):
        return False
    rows, cols = int(np.prod(shape[:ind])), int(np.prod(shape[ind:]))
    return rows == cols and 0 < rows <= steps.MAX_SIDE


@converter_case(lambda: Unary(lambda a: torch.linalg.tensorinv(a, ind=2), regular), inputs=[((4, 2, 8), "float32")])
def convert_linalg_tensorinv(ctx: ConverterContext) -> gs.Tensor:
    """``aten::linalg_tensorinv``: the inverse of the ``(prod(shape[:ind]), prod(shape[ind:]))`` matrix, reshaped
    to ``shape[ind:] + shape[:ind]``."""
    shape = [int(d) for d in ctx.input_shapes[0] or ()]
    ind = int(ctx.attrs["ind"])
    n, dtype = int(np.prod(shape[:ind])), _dtype(ctx)
    matrix = ctx.op.Reshape(ctx.inputs[0], const(ctx, np.array([n, n], np.int64), "square"))
    factors = steps.lu_factor(ctx, matrix, n, n, dtype)
    y = steps.solve_triangular(
        ctx, factors.packed, _pivot_order(ctx, factors.permutation, n, dtype), n, lower=True, unit=True
    )
    inverse = steps.solve_triangular(ctx, factors.packed, y, n, lower=False, unit=False)
    return ctx.op.Reshape(inverse, const(ctx, np.array(shape[ind:] + shape[:ind], np.int64), "shape"))


def register_lu_converters(registry: ConverterRegistry) -> None:
    """Register the LU-based converters on ``registry``, one explicit call each."""
    for target in ("linalg_lu_factor", "linalg_lu_factor_ex", "_lu_with_info"):
        registry.register(f"aten::{target}.default", validator=matrix_input)(convert_lu_factor)
    registry.register("aten::linalg_lu.default", validator=matrix_input)(convert_linalg_lu)
    registry.register("aten::lu_unpack.default", validator=unpacks_all)(convert_lu_unpack)
    registry.register("aten::linalg_solve.default", validator=solvable)(convert_linalg_solve)
    registry.register("aten::linalg_solve_ex.default", validator=solvable)(convert_linalg_solve)
    registry.register("aten::linalg_lu_solve.default", validator=_lu_solvable)(convert_linalg_lu_solve)
    registry.register("aten::lu_solve.default", validator=_old_lu_solvable)(convert_lu_solve)
    for target in ("linalg_inv", "linalg_inv_ex", "inverse"):
        registry.register(f"aten::{target}.default", validator=square_input)(convert_linalg_inv)
    registry.register("aten::linalg_det.default", validator=square_input)(convert_linalg_det)
    registry.register("aten::det.default", validator=square_input)(convert_linalg_det)
    registry.register("aten::linalg_slogdet.default", validator=square_input)(convert_linalg_slogdet)
    registry.register("aten::logdet.default", validator=square_input)(convert_logdet)
    registry.register("aten::linalg_tensorinv.default", validator=tensor_invertible)(convert_linalg_tensorinv)
