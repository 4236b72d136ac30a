"""Cyclic Jacobi rotations in one ONNX ``Loop``: the symmetric eigensolver and the one-sided (Hestenes) SVD behind
``converters/aten/eigen.py``.

A sweep rotates every pair of indices ``(p, q)`` once. The pairs are scheduled round-robin (the circle method):
each of the ``R = n - 1`` rounds (``n`` rounded up to even; the odd one out sits still) holds ``n / 2`` disjoint
pairs, whose rotations commute and are applied together as one ``n x n`` matrix ``J`` (``c`` on the diagonal,
``+-s`` at ``(p, q)`` / ``(q, p)``). The ``Loop`` runs ``sweeps * R`` rounds; its body is the same dozen-odd nodes
whatever the side: the round's pairing (a permutation matrix ``P`` and the sign of each index's role) is gathered
from constant tables by ``iteration mod R``.

- two-sided (symmetric eigen): ``A <- J^T A J``, ``V <- V J``; the rotated entries ``(p, q)`` are set to their
  exact value 0 and ``A`` is kept symmetric.
- one-sided (SVD of ``A``, ``m >= n``): ``A <- A J``, ``V <- V J`` with the rotation that would diagonalise the
  Gram matrix ``A^T A`` at ``(p, q)``; its entries (column norms and dot products) are recomputed from the
  rotated columns every round, never accumulated, which keeps small singular values accurate to their own size.

Rotation (Rutishauser, Golub & Van Loan's ``sym.schur2``): ``theta = (a_qq - a_pp) / (2 a_pq)``,
``t = sign(theta) / (|theta| + sqrt(theta^2 + 1))``, ``c = 1 / sqrt(t^2 + 1)``, ``s = t c`` (``t = 0`` where
``|a_pq|`` is below rounding of ``sqrt(|a_pp a_qq|)``): the smaller of the two angles, so the iteration converges
quadratically once the off-diagonal part is small.

Why :data:`SWEEPS` sweeps are enough: cyclic Jacobi shrinks the off-diagonal part linearly for a few sweeps, then
quadratically. Measured on ONNX Runtime in float32 (the loop alone, as ``tests/converters/aten/test_eigen.py``
does): for standard-normal symmetric matrices the relative off-diagonal norm ``||off(A)|| / ||A||`` is below 1e-13
after 6 sweeps at side 16, 7 at side 32 and 8 at side 64 (``MAX_SIDE``), then exactly 0; one-sided, the columns'
largest cosine reaches float32 rounding (~1e-7) after 6, 7 and 8 sweeps. The slowest cases measured, at side 64:
a symmetric matrix with eigenvalues spread 1 ... 1e-7 reaches 5e-9 after 11 sweeps and 0 after 14; the SVD of a
matrix with singular values spread 1 ... 1e-6 (clusters of tiny ones) reaches its float32 floor (singular values
within 9e-8 of float64's) after 15. Hence 15; past convergence a sweep changes nothing, as rotations below
rounding are skipped.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from converters.aten.numeric import linalg_steps as steps
from converters.aten.numeric.linalg_steps import const
from converters.context import ConverterContext

#: Sweeps of the cyclic Jacobi loop: enough for float32 at every side up to ``linalg_steps.MAX_SIDE`` (see above).
SWEEPS = 15


def round_robin(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The circle-method schedule of ``n`` indices: ``(partners, signs)``, ``partners`` ``(R, n, n)`` (one
    symmetric permutation matrix per round, a zero row for the index that sits out) and ``signs`` ``(R, n)``
    (+1 where the index is the first of its pair, -1 where it is the second, 0 when it sits out).

    >>> partners, signs = round_robin(3)
    >>> partners.shape, signs.shape
    ((3, 3, 3), (3, 3))
    """
    players = n + (n % 2)
    rounds = max(players - 1, 1)
    partners = np.zeros((rounds, n, n), np.float32)
    signs = np.zeros((rounds, n), np.float32)
    others = list(range(1, players))
    for r in range(rounds):
        order = [0, *others[r:], *others[:r]] if players > 1 else [0]
        for i in range(players // 2):
            p, q = sorted((order[i], order[players - 1 - i]))
            if q >= n:  # paired with the padding index: sits out this round
                continue
            partners[r, p, q] = partners[r, q, p] = 1.0
            signs[r, p], signs[r, q] = 1.0, -1.0
    return partners, signs


def _vector(ctx: ConverterContext, x: gs.Tensor, axis: int) -> gs.Tensor:
    return ctx.op.Unsqueeze(x, steps.axes(ctx, axis))


def _rotation(
    ctx: ConverterContext, diagonal: gs.Tensor, coupling: gs.Tensor, partner: gs.Tensor, sign: gs.Tensor, n: int
) -> tuple[gs.Tensor, gs.Tensor]:
    """``(K, t)``: the round's rotation as a correction ``J = I + K`` (``(..., n, n)``: ``c - 1 = -s^2 / (1 + c)``
    on the diagonal, ``+-s`` at the pairs; Rutishauser's form, whose updates ``A + A K`` round relative to the
    change, not to ``A``) and each index's ``t`` (``(..., n)``), from the diagonal ``a_ii`` and the couplings
    ``a_i,partner(i)``."""
    dtype = np.float32
    other = ctx.op.ReduceSum(ctx.op.Mul(_vector(ctx, diagonal, -2), partner), steps.axes(ctx, -1), keepdims=0)
    # a coupling below float32 rounding of the two diagonal entries (a cosine below eps, one-sided) is not rotated:
    # after convergence every rotation would otherwise add rounding to the columns (LAPACK's sgesvj skips them too)
    scale = ctx.op.Mul(ctx.op.Sqrt(ctx.op.Abs(diagonal)), ctx.op.Sqrt(ctx.op.Abs(other)))
    negligible = ctx.op.Mul(scale, steps.scalar(ctx, float(np.finfo(np.float32).eps), dtype))
    uncoupled = ctx.op.LessOrEqual(ctx.op.Abs(coupling), negligible)
    denominator = ctx.op.Where(uncoupled, steps.scalar(ctx, 1.0, dtype), ctx.op.Add(coupling, coupling))
    theta = ctx.op.Div(ctx.op.Mul(sign, ctx.op.Sub(other, diagonal)), denominator)
    magnitude = ctx.op.Abs(theta)
    hypotenuse = ctx.op.Sqrt(ctx.op.Add(ctx.op.Mul(theta, theta), steps.scalar(ctx, 1.0, dtype)))
    unit = ctx.op.Where(
        ctx.op.Less(theta, steps.scalar(ctx, 0.0, dtype)), steps.scalar(ctx, -1.0, dtype), steps.scalar(ctx, 1.0, dtype)
    )
    t = ctx.op.Div(unit, ctx.op.Add(magnitude, hypotenuse))
    t = ctx.op.Where(uncoupled, steps.scalar(ctx, 0.0, dtype), t)
    c = ctx.op.Reciprocal(ctx.op.Sqrt(ctx.op.Add(ctx.op.Mul(t, t), steps.scalar(ctx, 1.0, dtype))))
    s = ctx.op.Mul(t, c)
    shrink = ctx.op.Neg(ctx.op.Div(ctx.op.Mul(s, s), ctx.op.Add(c, steps.scalar(ctx, 1.0, dtype))))
    eye = const(ctx, np.eye(n, dtype=np.float32), "eye")
    pairs = ctx.op.Mul(_vector(ctx, ctx.op.Mul(s, sign), -1), partner)
    k = ctx.op.Add(ctx.op.Mul(_vector(ctx, shrink, -1), eye), pairs)
    return k, t


def _typed(tensor: gs.Tensor) -> gs.Tensor:
    """A Loop body output with its element type recorded (ONNX requires a subgraph's outputs typed)."""
    tensor.dtype = np.dtype(np.float32)
    return tensor


def _corrected(ctx: ConverterContext, x: gs.Tensor, k: gs.Tensor) -> gs.Tensor:
    """``x J = x + x K``."""
    return ctx.op.Add(x, ctx.op.MatMul(x, k))


def _two_sided(
    ctx: ConverterContext, a: gs.Tensor, v: gs.Tensor, partner: gs.Tensor, sign: gs.Tensor, n: int, rank: int
) -> tuple[gs.Tensor, gs.Tensor]:
    """One round of the symmetric eigensolver: ``(J^T A J, V J)``; the new diagonal is Rutishauser's
    ``a_pp - t a_pq`` / ``a_qq + t a_pq`` and the rotated couplings are exactly 0."""
    eye = const(ctx, np.eye(n, dtype=np.float32), "eye")
    diagonal = ctx.op.ReduceSum(ctx.op.Mul(a, eye), steps.axes(ctx, -1), keepdims=0)
    coupling = ctx.op.ReduceSum(ctx.op.Mul(a, partner), steps.axes(ctx, -1), keepdims=0)
    k, t = _rotation(ctx, diagonal, coupling, partner, sign, n)
    right = _corrected(ctx, a, k)
    rotated = ctx.op.Add(right, ctx.op.MatMul(steps.swap_last(ctx, k, rank), right))
    symmetric = ctx.op.Mul(ctx.op.Add(rotated, steps.swap_last(ctx, rotated, rank)), steps.scalar(ctx, 0.5, np.float32))
    off_pairs = ctx.op.Sub(steps.scalar(ctx, 1.0, np.float32), ctx.op.Add(partner, eye))
    new_diagonal = ctx.op.Sub(diagonal, ctx.op.Mul(ctx.op.Mul(sign, t), coupling))
    updated = ctx.op.Add(ctx.op.Mul(symmetric, off_pairs), ctx.op.Mul(_vector(ctx, new_diagonal, -1), eye))
    return updated, _corrected(ctx, v, k)


def _one_sided(
    ctx: ConverterContext, a: gs.Tensor, v: gs.Tensor, partner: gs.Tensor, sign: gs.Tensor, n: int, rank: int
) -> tuple[gs.Tensor, gs.Tensor]:
    """One round of the Hestenes SVD: ``(A J, V J)`` with ``J`` from the current columns' norms and products."""
    norms = ctx.op.ReduceSum(ctx.op.Mul(a, a), steps.axes(ctx, -2), keepdims=0)
    coupling = ctx.op.ReduceSum(ctx.op.Mul(a, ctx.op.MatMul(a, partner)), steps.axes(ctx, -2), keepdims=0)
    k, _ = _rotation(ctx, norms, coupling, partner, sign, n)
    return _corrected(ctx, a, k), _corrected(ctx, v, k)


def jacobi(
    ctx: ConverterContext, a: gs.Tensor, n: int, rank: int, *, one_sided: bool, sweeps: int = SWEEPS
) -> tuple[gs.Tensor, gs.Tensor]:
    """``(A_final, V)`` after ``sweeps`` cyclic Jacobi sweeps over the ``n`` columns of ``a`` (float32, rank
    ``rank``, batch dimensions may be dynamic): two-sided, ``A_final`` is diagonal (the eigenvalues) and
    ``A = V A_final V^T``; one-sided, ``A_final = A V`` has orthogonal columns (their norms are the singular
    values)."""
    partners, signs = round_robin(n)
    rounds = partners.shape[0]
    batch = steps.take(ctx, ctx.op.Shape(a), 0, rank - 2, 0)
    square = ctx.op.Concat(batch, const(ctx, np.array([n, n], np.int64), "side"), axis=0)
    v0 = ctx.op.Expand(const(ctx, np.eye(n, dtype=np.float32), "eye"), square)

    outer_nodes = len(ctx.graph.nodes)
    iteration = gs.Variable(ctx.fresh_name("jacobi_round"), dtype=np.int64, shape=[])
    condition = gs.Variable(ctx.fresh_name("jacobi_cond"), dtype=np.bool_, shape=[])
    a_in = gs.Variable(ctx.fresh_name("jacobi_a"), dtype=np.float32)
    v_in = gs.Variable(ctx.fresh_name("jacobi_v"), dtype=np.float32)
    index = ctx.op.Mod(iteration, const(ctx, np.array(rounds, np.int64), "rounds"))
    partner = ctx.op.Gather(const(ctx, partners, "partners"), index, axis=0)
    sign = ctx.op.Gather(const(ctx, signs, "signs"), index, axis=0)
    step = _one_sided if one_sided else _two_sided
    a_out, v_out = step(ctx, a_in, v_in, partner, sign, n, rank)
    keep_going = ctx.op.Identity(condition)
    body_nodes = ctx.graph.nodes[outer_nodes:]
    del ctx.graph.nodes[outer_nodes:]
    keep_going.dtype = np.dtype(np.bool_)
    body = gs.Graph(
        nodes=body_nodes,
        inputs=[iteration, condition, a_in, v_in],
        outputs=[keep_going, _typed(a_out), _typed(v_out)],
        name=ctx.fresh_name("jacobi"),
        opset=ctx.opset,
    )
    trips = const(ctx, np.array(sweeps * rounds, np.int64), "trips")
    a_final, v_final = ctx.op.Loop(trips, const(ctx, np.array(True), "true"), a, v0, body=body, outputs=2)
    return a_final, v_final


def sort_columns(
    ctx: ConverterContext, values: gs.Tensor, vectors: gs.Tensor | None, n: int, *, descending: bool
) -> tuple[gs.Tensor, gs.Tensor | None]:
    """``values`` (``(..., n)``) sorted along the last axis and the columns of ``vectors`` (``(..., k, n)``) in the
    same order."""
    sorted_values, order = ctx.op.TopK(
        values, const(ctx, np.array([n], np.int64), "k"), axis=-1, largest=int(descending), sorted=1, outputs=2
    )
    if vectors is None:
        return sorted_values, None
    columns = ctx.op.Expand(_vector(ctx, order, -2), ctx.op.Shape(vectors))
    return sorted_values, ctx.op.GatherElements(vectors, columns, axis=-1)
