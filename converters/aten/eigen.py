"""Built-in converters for the symmetric eigendecomposition, the SVD and the pseudo-inverse: ``_linalg_eigh``,
``_linalg_svd`` and ``linalg_pinv``, by cyclic Jacobi rotations in one ONNX ``Loop`` (``numeric/jacobi.py``).

The matrix side must be static and at most ``linalg_steps.MAX_SIDE`` (batch dimensions may be dynamic); beyond it,
or for a dtype other than float32, the converter raises a ``ConversionError`` that says so. Eigenvalues come out
ascending and singular values descending, as PyTorch's. Eigen- and singular vectors are unique only up to the
sign of each column (and, for repeated values, up to a rotation within their space): LAPACK's choice is not
reproduced, so models that return them differ from PyTorch where it matters (``|v|``, ``V diag(w) V^T``,
``pinv`` agree).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.aten.case_modules import Unary
from converters.aten.numeric import linalg_steps as steps
from converters.aten.numeric.jacobi import jacobi, sort_columns
from converters.aten.numeric.linalg_steps import const, scalar
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.errors import ConversionError
from converters.registry import ConverterRegistry

_F32 = np.dtype(np.float32)


def _matrix(ctx: ConverterContext) -> tuple[int, int, int]:
    """``(rows, cols, rank)`` of the first input; a ConversionError where the Jacobi loop cannot take it."""
    shape = ctx.input_shapes[0]
    dtype = ctx.input_dtypes[0]
    if shape is None or len(shape) < 2 or steps.static_matrix(shape, square=False) is None:
        raise ConversionError(
            f"{ctx.key}: the matrix sides must be static and at most {steps.MAX_SIDE}, not empty (got shape {shape})",
            node=ctx.name,
            fix=f"mark only batch dimensions dynamic, and keep the matrix within {steps.MAX_SIDE} x {steps.MAX_SIDE}"
            " (the Jacobi loop's tables and cost grow with the side), or compute this op outside the model",
        )
    if dtype is not None and np.dtype(dtype) != _F32:
        raise ConversionError(
            f"{ctx.key}: the Jacobi converter computes in float32, the input is {np.dtype(dtype).name}",
            node=ctx.name,
            fix="run the decomposition in float32 (cast the matrix with .float() before it)",
        )
    return int(shape[-2]), int(shape[-1]), len(shape)


def _empty(ctx: ConverterContext) -> gs.Constant:
    """PyTorch's placeholder for an output that was not asked for: an empty 1-d tensor."""
    return const(ctx, np.zeros((0,), np.float32), "empty")


def _row(ctx: ConverterContext, x: gs.Tensor) -> gs.Tensor:
    """``(..., n)`` as ``(..., 1, n)``: one factor per column."""
    return ctx.op.Unsqueeze(x, steps.axes(ctx, -2))


# ---------------------------------------------------------------------------------------------- eigh


def symmetric_eigen(
    ctx: ConverterContext, a: gs.Tensor, n: int, rank: int, *, lower: bool
) -> tuple[gs.Tensor, gs.Tensor]:
    """``(eigenvalues ascending (..., n), eigenvectors as columns (..., n, n))`` of the symmetric matrix whose
    ``lower`` (or upper) triangle ``a`` holds."""
    zero = const(ctx, np.array(0, np.int64), "k")
    minus_one = const(ctx, np.array(-1 if lower else 1, np.int64), "k")
    triangle = ctx.op.Trilu(a, zero, upper=int(not lower))
    strict = ctx.op.Trilu(a, minus_one, upper=int(not lower))
    symmetric = ctx.op.Add(triangle, steps.swap_last(ctx, strict, rank))
    diagonal, vectors = jacobi(ctx, symmetric, n, rank, one_sided=False)
    eye = const(ctx, np.eye(n, dtype=np.float32), "eye")
    values = ctx.op.ReduceSum(ctx.op.Mul(diagonal, eye), steps.axes(ctx, -1), keepdims=0)
    ordered, columns = sort_columns(ctx, values, vectors, n, descending=False)
    assert columns is not None
    return ordered, columns


def _eigh_sample(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues, and eigenvectors with each column's sign removed (``|V|``: the part PyTorch fixes)."""
    values, vectors = torch.linalg.eigh(a)
    return values, vectors.abs()


@converter_case(lambda: Unary(torch.linalg.eigvalsh), inputs=[((5, 5), "float32")])
@converter_case(lambda: Unary(_eigh_sample), inputs=[((2, 4, 4), "float32")], dynamic={"a": {0: ("batch", 1, 2, 4)}})
def convert_linalg_eigh(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::_linalg_eigh``: ``(eigenvalues, eigenvectors)`` of the symmetric matrix in the ``UPLO`` triangle
    (the other triangle is not read), eigenvalues ascending; ``compute_v=False`` leaves the vectors empty."""
    _, n, rank = _matrix(ctx)
    lower = str(ctx.attrs.get("UPLO", "L")).upper() == "L"
    values, vectors = symmetric_eigen(ctx, ctx.inputs[0], n, rank, lower=lower)
    return [values, vectors if ctx.attrs.get("compute_v", True) else _empty(ctx)]


# ---------------------------------------------------------------------------------------------- svd


def _complete(
    ctx: ConverterContext, u: gs.Tensor, sigma: gs.Tensor, m: int, k: int, width: int, rank: int
) -> gs.Tensor:
    """``u`` (``(..., m, k)``, orthonormal columns where ``sigma > 0``, zero columns after them) completed to
    ``width`` orthonormal columns. The missing ones are eigenvectors of the projector ``I - u u^T`` onto the
    complement of ``u``'s columns (eigenvalue 1; the ``r`` columns of ``u`` have eigenvalue 0 and sort first), by
    the same Jacobi loop: the graph stays the same size whatever ``m``."""
    projector = ctx.op.Sub(
        const(ctx, np.eye(m, dtype=np.float32), "eye"), ctx.op.MatMul(u, steps.swap_last(ctx, u, rank))
    )
    _, basis = symmetric_eigen(ctx, projector, m, rank, lower=True)
    kept = ctx.op.Where(ctx.op.Greater(_row(ctx, sigma), scalar(ctx, 0.0, _F32)), u, steps.take(ctx, basis, 0, k, -1))
    return kept if width == k else ctx.op.Concat(kept, steps.take(ctx, basis, k, width, -1), axis=-1)


def singular_values(
    ctx: ConverterContext, a: gs.Tensor, m: int, n: int, rank: int
) -> tuple[gs.Tensor, gs.Tensor, gs.Tensor, bool]:
    """``(U_thin, S, V, transposed)`` by the one-sided Jacobi SVD of ``a`` (of its transpose when ``m < n``, then
    ``U`` and ``V`` are swapped back by the caller through ``transposed``): ``S`` descending ``(..., k)``,
    ``U_thin`` ``(..., max, k)`` with zero columns where ``S = 0``, ``V`` ``(..., k, k)``, ``k = min(m, n)``."""
    transposed = m < n
    b = steps.swap_last(ctx, a, rank) if transposed else a
    k = min(m, n)
    columns, v = jacobi(ctx, b, k, rank, one_sided=True)
    norms = ctx.op.Sqrt(ctx.op.ReduceSum(ctx.op.Mul(columns, columns), steps.axes(ctx, -2), keepdims=0))
    sigma, v_sorted = sort_columns(ctx, norms, v, k, descending=True)
    _, columns_sorted = sort_columns(ctx, norms, columns, k, descending=True)
    assert v_sorted is not None and columns_sorted is not None
    positive = ctx.op.Greater(sigma, scalar(ctx, 0.0, _F32))
    divisor = ctx.op.Where(positive, sigma, scalar(ctx, 1.0, _F32))
    u = ctx.op.Div(columns_sorted, _row(ctx, divisor))
    return u, sigma, v_sorted, transposed


def _svd_sample(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``S``, ``|U|``, ``|Vh|`` (the parts PyTorch fixes) and the reconstruction ``U diag(S) Vh``."""
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    return s, u.abs(), vh.abs(), (u * s.unsqueeze(-2)) @ vh


def _full_svd_sample(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``S``, and ``U^T U``, ``Vh Vh^T`` of the full factors (the identity: the completion is orthonormal)."""
    u, s, vh = torch.linalg.svd(a, full_matrices=True)
    return s, u.mT @ u, vh @ vh.mT, u[..., : s.shape[-1]].abs()


@converter_case(lambda: Unary(torch.linalg.svdvals), inputs=[((5, 5), "float32")])
@converter_case(lambda: Unary(_svd_sample), inputs=[((2, 6, 4), "float32")], dynamic={"a": {0: ("batch", 1, 2, 4)}})
@converter_case(lambda: Unary(_full_svd_sample), inputs=[((2, 3, 4), "float32")])
def convert_linalg_svd(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::_linalg_svd``: ``(U, S, Vh)``, ``S`` descending; ``full_matrices`` completes the longer side's
    factor to a square orthogonal matrix; ``compute_uv=False`` leaves ``U`` and ``Vh`` empty."""
    m, n, rank = _matrix(ctx)
    u, sigma, v, transposed = singular_values(ctx, ctx.inputs[0], m, n, rank)
    if not ctx.attrs.get("compute_uv", True):
        return [_empty(ctx), sigma, _empty(ctx)]
    k, longer = min(m, n), max(m, n)
    width = longer if ctx.attrs.get("full_matrices", True) else k
    u = _complete(ctx, u, sigma, longer, k, width, rank)
    if transposed:  # the SVD of A^T = V S U^T
        return [v, sigma, steps.swap_last(ctx, u, rank)]
    return [u, sigma, steps.swap_last(ctx, v, rank)]


# ---------------------------------------------------------------------------------------------- pinv


def _tolerance(ctx: ConverterContext, name: str) -> gs.Tensor | None:
    """The ``atol``/``rtol`` argument as a float32 tensor (a Scalar attribute or a tensor input), None if omitted."""
    if ctx.key.op_type.endswith(".atol_rtol_tensor"):
        tensor = ctx.input(name)
        if tensor is None:
            return None
        if isinstance(tensor, gs.Constant):
            return const(ctx, np.asarray(tensor.values, np.float32), name)
        return ctx.op.Cast(tensor, to=1)
    value = ctx.attrs.get(name)
    if name == "rtol" and value is None and "rcond" in ctx.attrs:
        value = ctx.attrs["rcond"]
    return None if value is None else scalar(ctx, float(value), _F32)


def _cutoff(ctx: ConverterContext, largest: gs.Tensor, m: int, n: int) -> gs.Tensor:
    """PyTorch's ``max(atol, rtol * largest)`` (``largest``: ``(..., 1)``), with its defaults: ``atol = 0``;
    ``rtol = eps * max(m, n)`` when neither is given, 0 when ``atol > 0`` is given alone."""
    atol, rtol = _tolerance(ctx, "atol"), _tolerance(ctx, "rtol")
    default = scalar(ctx, float(np.finfo(np.float32).eps) * max(m, n), _F32)
    zero = scalar(ctx, 0.0, _F32)
    if rtol is None:
        rtol = default if atol is None else ctx.op.Where(ctx.op.Greater(atol, zero), zero, default)
    atol = zero if atol is None else atol
    return ctx.op.Max(_vector_last(ctx, atol), ctx.op.Mul(_vector_last(ctx, rtol), largest))


def _vector_last(ctx: ConverterContext, x: gs.Tensor) -> gs.Tensor:
    """A per-matrix tolerance (0-d, or batch-shaped ``(...)``) as ``(..., 1)``, as PyTorch's ``unsqueeze(-1)``."""
    return ctx.op.Unsqueeze(x, steps.axes(ctx, -1))


def _reciprocal_above(ctx: ConverterContext, values: gs.Tensor, magnitude: gs.Tensor, cutoff: gs.Tensor) -> gs.Tensor:
    """``1 / values`` where ``magnitude > cutoff``, else 0 (the values PyTorch's pinv inverts)."""
    kept = ctx.op.Greater(magnitude, cutoff)
    safe = ctx.op.Where(kept, values, scalar(ctx, 1.0, _F32))
    return ctx.op.Where(kept, ctx.op.Reciprocal(safe), scalar(ctx, 0.0, _F32))


@converter_case(lambda: Unary(torch.linalg.pinv), inputs=[((5, 5), "float32")])
@converter_case(lambda: Unary(lambda a: torch.linalg.pinv(a + a.mT, hermitian=True)), inputs=[((4, 4), "float32")])
@converter_case(lambda: Unary(lambda a: torch.pinverse(a, rcond=0.1)), inputs=[((4, 3), "float32")])
def convert_linalg_pinv(ctx: ConverterContext) -> gs.Tensor:
    """``aten::linalg_pinv`` (every overload): ``V diag(1/S) U^T`` over the singular values above PyTorch's cutoff
    ``max(atol, rtol * S_max)``; ``hermitian`` uses the eigendecomposition of the lower triangle (``|w|`` against
    the cutoff, ``U diag(1/w) U^T``)."""
    m, n, rank = _matrix(ctx)
    a = ctx.inputs[0]
    if ctx.attrs.get("hermitian", False):
        values, vectors = symmetric_eigen(ctx, a, n, rank, lower=True)
        magnitude = ctx.op.Abs(values)
        largest = ctx.op.ReduceMax(magnitude, steps.axes(ctx, -1), keepdims=1)
        inverse = _reciprocal_above(ctx, values, magnitude, _cutoff(ctx, largest, m, n))
        return ctx.op.MatMul(ctx.op.Mul(vectors, _row(ctx, inverse)), steps.swap_last(ctx, vectors, rank))
    u, sigma, v, transposed = singular_values(ctx, a, m, n, rank)
    largest = steps.take(ctx, sigma, 0, 1, -1)
    inverse = _reciprocal_above(ctx, sigma, sigma, _cutoff(ctx, largest, m, n))
    left, right = (u, v) if transposed else (v, u)  # pinv(A) = V S^+ U^T; for A^T's SVD, U and V trade places
    return ctx.op.MatMul(ctx.op.Mul(left, _row(ctx, inverse)), steps.swap_last(ctx, right, rank))


def register_eigen_converters(registry: ConverterRegistry) -> None:
    """Register the Jacobi eigen/SVD/pseudo-inverse converters on ``registry``, one explicit call each."""
    registry.register("aten::_linalg_eigh.default")(convert_linalg_eigh)
    registry.register("aten::_linalg_svd.default")(convert_linalg_svd)
    registry.register("aten::linalg_pinv.atol_rtol_tensor")(convert_linalg_pinv)
    registry.register("aten::linalg_pinv.atol_rtol_float")(convert_linalg_pinv)
    registry.register("aten::linalg_pinv.default")(convert_linalg_pinv)
