"""Built-in converters for the Householder QR family: ``geqrf``, ``linalg_householder_product``, ``linalg_qr``
and ``qr``, LAPACK's ``geqr2``/``org2r`` unrolled over the static matrix sides (``dlarfg``'s sign convention, so
Q and R agree with PyTorch's, signs included). Validators decline dynamic or large sides and ``mode="r"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.aten.case_modules import Unary
from converters.aten.linalg import matrix_input
from converters.aten.numeric import linalg_steps as steps
from converters.aten.numeric.linalg_steps import const, scalar
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from converters.settings import Settings


def _dims(ctx: ConverterContext) -> tuple[int, int, Any]:
    shape = ctx.input_shapes[0]
    assert shape is not None
    return int(shape[-2]), int(shape[-1]), ctx.input_dtypes[0] or np.dtype(np.float32)


def householder_qr(ctx: ConverterContext, a: gs.Tensor, m: int, n: int, dtype: Any) -> tuple[gs.Tensor, gs.Tensor]:
    """``(a, tau)`` as LAPACK's ``geqrf`` returns them: R on and above the diagonal, the Householder vectors
    below it, and the ``min(m, n)`` scalars ``tau``."""
    rows, cols = np.arange(m).reshape(m, 1), np.arange(n).reshape(1, n)
    zero = scalar(ctx, 0.0, dtype)
    taus = []
    for k in range(min(m, n)):
        column = steps.take(ctx, a, k, k + 1, -1)
        alpha = steps.take(ctx, column, k, k + 1, -2)
        below = ctx.op.Where(const(ctx, rows > k, "below"), column, zero)
        tail = ctx.op.ReduceSum(ctx.op.Mul(below, below), steps.axes(ctx, -2), keepdims=1)
        norm = ctx.op.Sqrt(ctx.op.Add(ctx.op.Mul(alpha, alpha), tail))
        beta = ctx.op.Where(ctx.op.GreaterOrEqual(alpha, zero), ctx.op.Neg(norm), norm)
        trivial = ctx.op.Equal(tail, zero)  # nothing below the diagonal: H = I, tau = 0
        tau = ctx.op.Where(trivial, zero, ctx.op.Div(ctx.op.Sub(beta, alpha), beta))
        scale = ctx.op.Where(trivial, scalar(ctx, 1.0, dtype), ctx.op.Sub(alpha, beta))
        u = ctx.op.Where(const(ctx, rows == k, "head"), scalar(ctx, 1.0, dtype), ctx.op.Div(below, scale))
        weights = ctx.op.Mul(ctx.op.ReduceSum(ctx.op.Mul(u, a), steps.axes(ctx, -2), keepdims=1), tau)
        weights = ctx.op.Where(const(ctx, cols > k, "right"), weights, zero)
        a = ctx.op.Sub(a, ctx.op.Mul(u, weights))
        diagonal = ctx.op.Where(trivial, alpha, beta)
        a = ctx.op.Where(const(ctx, (rows == k) & (cols == k), "pivot"), diagonal, a)
        a = ctx.op.Where(const(ctx, (rows > k) & (cols == k), "vector"), u, a)
        taus.append(tau)
    stacked = taus[0] if len(taus) == 1 else ctx.op.Concat(*taus, axis=-1)
    return a, ctx.op.Squeeze(stacked, steps.axes(ctx, -2))


def householder_product(
    ctx: ConverterContext, a: gs.Tensor, tau: gs.Tensor, m: int, width: int, count: int, dtype: Any
) -> gs.Tensor:
    """``H_0 H_1 ... H_{count-1}`` applied to the first ``width`` columns of the identity (``org2r``), from the
    vectors below ``a``'s diagonal and the scalars ``tau`` (``(..., count)``)."""
    rows = np.arange(m).reshape(m, 1)
    q: gs.Tensor = const(ctx, np.eye(m, width, dtype=np.dtype(dtype)), "eye")
    for i in range(count - 1, -1, -1):
        column = steps.take(ctx, a, i, i + 1, -1)
        u = ctx.op.Where(
            const(ctx, rows == i, "head"),
            scalar(ctx, 1.0, dtype),
            ctx.op.Where(const(ctx, rows > i, "below"), column, scalar(ctx, 0.0, dtype)),
        )
        scale = ctx.op.Unsqueeze(steps.take(ctx, tau, i, i + 1, -1), steps.axes(ctx, -1))  # (..., 1, 1)
        weights = ctx.op.Mul(ctx.op.ReduceSum(ctx.op.Mul(u, q), steps.axes(ctx, -2), keepdims=1), scale)
        q = ctx.op.Sub(q, ctx.op.Mul(u, weights))
    return q


@converter_case(lambda: Unary(torch.geqrf), inputs=[((5, 3), "float32")])
@converter_case(lambda: Unary(torch.geqrf), inputs=[((2, 3, 4), "float32")])
def convert_geqrf(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::geqrf``: ``(a, tau)``, Householder QR as LAPACK stores it."""
    m, n, dtype = _dims(ctx)
    a, tau = householder_qr(ctx, ctx.inputs[0], m, n, dtype)
    return [a, tau]


def _product_shapes(node: gs.Node, settings: Settings) -> bool:
    tau = node.inputs[1].shape if len(node.inputs) > 1 else None
    return matrix_input(node, settings) and tau is not None and isinstance(tau[-1], int)


@converter_case(
    lambda: Unary(lambda a: torch.linalg.householder_product(*torch.geqrf(a))), inputs=[((6, 4), "float32")]
)
def convert_householder_product(ctx: ConverterContext) -> gs.Tensor:
    """``aten::linalg_householder_product``: the first ``n`` columns of ``H_0 ... H_{k-1}``."""
    m, n, dtype = _dims(ctx)
    count = int((ctx.input_shapes[1] or (0,))[-1])
    return householder_product(ctx, ctx.inputs[0], ctx.inputs[1], m, n, count, dtype)


def qr_mode_known(node: gs.Node, settings: Settings) -> bool:
    """``linalg_qr`` with static sides and mode ``reduced`` or ``complete`` (``r`` returns an empty Q)."""
    mode = node.attrs.get("mode", "reduced")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    return matrix_input(node, settings) and mode in ("reduced", "complete")


@converter_case(lambda: Unary(torch.linalg.qr), inputs=[((5, 3), "float32")])
@converter_case(lambda: Unary(lambda a: torch.linalg.qr(a, mode="complete")), inputs=[((2, 4, 3), "float32")])
@converter_case(lambda: Unary(torch.qr), inputs=[((3, 5), "float32")])
def convert_linalg_qr(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::linalg_qr`` / ``qr``: ``(Q, R)``; reduced (``some``) or complete."""
    m, n, dtype = _dims(ctx)
    k = min(m, n)
    mode = ctx.attrs.get("mode", "reduced")
    complete = mode == "complete" if "mode" in ctx.attrs else not bool(ctx.attrs.get("some", True))
    a, tau = householder_qr(ctx, ctx.inputs[0], m, n, dtype)
    q = householder_product(ctx, a, tau, m, m if complete else k, k, dtype)
    rows_of_r = m if complete else k
    r = ctx.op.Trilu(steps.take(ctx, a, 0, rows_of_r, -2), const(ctx, np.array(0, np.int64), "k"), upper=1)
    return [q, r]


def _ormqr_shapes(node: gs.Node, settings: Settings) -> bool:
    tau, other = (node.inputs[i].shape if len(node.inputs) > i else None for i in (1, 2))
    known = tau is not None and isinstance(tau[-1], int) and other is not None and len(other) >= 2
    return matrix_input(node, settings) and known


@converter_case(lambda: Unary(lambda a: torch.ormqr(*torch.geqrf(a), a.mT @ a)), inputs=[((4, 4), "float32")])
@converter_case(
    lambda: Unary(lambda a: torch.ormqr(*torch.geqrf(a), a.mT, left=False, transpose=True)),
    inputs=[((2, 5, 3), "float32")],
)
def convert_ormqr(ctx: ConverterContext) -> gs.Tensor:
    """``aten::ormqr``: ``Q C``, ``Q^T C``, ``C Q`` or ``C Q^T`` (``left``, ``transpose``) with ``Q = H_0 ...
    H_{k-1}`` from ``geqrf``'s factors, one reflection at a time (``C - u (tau u^T C)`` or ``C - (C u) tau u^T``)."""
    m, _, dtype = _dims(ctx)
    a, tau, c = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    count = int((ctx.input_shapes[1] or (0,))[-1])
    left, transpose = bool(ctx.attrs["left"]), bool(ctx.attrs["transpose"])
    rows = np.arange(m).reshape(m, 1)
    order = range(count) if left == transpose else range(count - 1, -1, -1)
    for i in order:
        column = steps.take(ctx, a, i, i + 1, -1)
        u = ctx.op.Where(
            const(ctx, rows == i, "head"),
            scalar(ctx, 1.0, dtype),
            ctx.op.Where(const(ctx, rows > i, "below"), column, scalar(ctx, 0.0, dtype)),
        )
        scale = ctx.op.Unsqueeze(steps.take(ctx, tau, i, i + 1, -1), steps.axes(ctx, -1))
        if left:  # (m, 1) against C (m, p)
            c = ctx.op.Sub(
                c, ctx.op.Mul(u, ctx.op.Mul(ctx.op.ReduceSum(ctx.op.Mul(u, c), steps.axes(ctx, -2), keepdims=1), scale))
            )
        else:  # C (p, m) against u as a row (1, m)
            row = steps.swap_last(ctx, u, len(ctx.input_shapes[0] or ()))
            c = ctx.op.Sub(
                c,
                ctx.op.Mul(
                    ctx.op.Mul(ctx.op.ReduceSum(ctx.op.Mul(c, row), steps.axes(ctx, -1), keepdims=1), scale), row
                ),
            )
    return c


def register_qr_converters(registry: ConverterRegistry) -> None:
    """Register the Householder QR converters on ``registry``, one explicit call each."""
    registry.register("aten::geqrf.default", validator=matrix_input)(convert_geqrf)
    registry.register("aten::linalg_householder_product.default", validator=_product_shapes)(
        convert_householder_product
    )
    registry.register("aten::linalg_qr.default", validator=qr_mode_known)(convert_linalg_qr)
    registry.register("aten::qr.default", validator=matrix_input)(convert_linalg_qr)
    registry.register("aten::ormqr.default", validator=_ormqr_shapes)(convert_ormqr)
