"""DFT as MatMul with a constant DFT matrix (TensorRT's parser rejects DFT before 11.2).

ONNX writes a complex number as a trailing dimension of 2 (real, imaginary) and a real one as a trailing 1. With
the transformed axis moved next to that trailing dimension, the two are merged, so one real MatMul does the whole
complex product: ``[..., L, c] -> [..., L*c] @ W[L*c, K*c_out] -> [..., K, c_out]``. ``W`` holds cos and sin of
``2*pi*k*n/N`` (argument reduced modulo N in float64, then cast to the input dtype), the ``1/N`` of the inverse,
the zero padding or truncation to ``dft_length``, and for the one-sided inverse (IRFFT) the Hermitian extension.

Covered: opset 17 (``axis`` attribute) and 20 (``axis`` input); real and complex input; forward and inverse;
``onesided`` forward on real input (RFFT) and ``onesided`` inverse (IRFFT); ``axis`` and ``dft_length`` static
(initializers, Constant nodes or shape arithmetic); the transformed axis and the trailing dimension static (the
other dimensions may be dynamic); float32, float16 and float64. Left, with the reason: bfloat16 (no bfloat16
constant here), a one-sided forward DFT of complex input (undefined; ONNX Runtime rejects it), an IRFFT whose
input has other than ``dft_length // 2 + 1`` bins (ONNX Runtime 1.31 disagrees there with the ONNX spec and
PyTorch; the exporter pads to that count first, so exported graphs never have it), and a matrix over
``MAX_DFT_MATRIX_BYTES``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import ValueResolver, dtype_of, is_omitted, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule

#: A DFT whose matrix would be larger than this stays a DFT (64 MiB is a 2048-point complex DFT in float32).
MAX_DFT_MATRIX_BYTES = 64 << 20

_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64))


@dataclass(frozen=True)
class DftPlan:
    """DFT with a static length along a supported axis: the sizes and flags the constant DFT matrix is built from."""

    axis: int  # non-negative, in [0, rank - 2]
    rank: int
    length: int  # L: the input's size along axis
    channels: int  # c: 1 (real) or 2 (complex)
    dft_length: int  # N
    inverse: bool
    onesided: bool
    dtype: np.dtype

    @property
    def bins(self) -> int:
        """K: the output's size along axis."""
        return self.dft_length // 2 + 1 if self.onesided and not self.inverse else self.dft_length

    @property
    def out_channels(self) -> int:
        """2 (complex) unless an inverse one-sided DFT returns real values."""
        return 1 if self.onesided and self.inverse else 2


class DftToMatMul(RewriteRule[DftPlan]):
    """``DFT`` -> ``Reshape``, ``MatMul`` with the constant DFT matrix, ``Reshape`` (between two ``Transpose`` when
    the transformed axis is not the last signal axis)."""

    name = "dft_to_matmul"
    ops = frozenset({"DFT"})

    def check(self, node: gs.Node, facts: Facts) -> DftPlan | str:
        """A plan when the DFT length is static and its attributes are supported; else the reason."""
        x = node.inputs[0]
        dtype, rank = dtype_of(x), rank_of(x)
        if dtype not in _DTYPES:
            return f"input dtype {dtype} is not float32, float16 or float64"
        if rank is None or rank < 2:
            return "input rank unknown"
        resolver = ValueResolver(facts.opset)
        axis = _static_input(node, 2, resolver, default=-2) if facts.opset >= 20 else node.attrs.get("axis", 1)
        if axis is None:
            return "axis is not static"
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis <= rank - 2:
            return f"axis {axis} out of range for rank {rank}"
        length, channels = x.shape[axis], x.shape[-1]
        if not isinstance(length, int | np.integer) or not isinstance(channels, int | np.integer) or channels > 2:
            return f"the transformed axis ({length}) and the trailing dimension ({channels}) must be static, c = 1 or 2"
        length, channels = int(length), int(channels)
        inverse, onesided = bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))
        default = 2 * (length - 1) if inverse and onesided else length
        dft_length = _static_input(node, 1, resolver, default=default)
        if dft_length is None or dft_length < 1:
            return "dft_length is not static and positive"
        plan = DftPlan(axis, rank, length, channels, dft_length, inverse, onesided, dtype)
        return _unsupported_mode(plan) or plan

    def rewrite(self, plan: DftPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Move the axis next to the complex dimension, multiply by the constant DFT matrix, move it back."""
        x, last = ctx.node.inputs[0], plan.rank - 1
        perm = [d for d in range(last) if d != plan.axis] + [plan.axis, last]
        moved = perm != list(range(plan.rank))
        if moved:  # the transformed axis goes next to the complex dimension, so they can merge
            x = ctx.typed(plan.dtype).Transpose(x, perm=perm)
        keep = [0] * (plan.rank - 2)  # Reshape's 0 copies a dimension: the batch-like ones may be dynamic
        flat = ctx.typed(plan.dtype).Reshape(x, np.array([*keep, plan.length * plan.channels], np.int64))
        matrix = ctx.constant(dft_matrix(plan).astype(plan.dtype), "dft_matrix")
        product = ctx.typed(plan.dtype).MatMul(flat, matrix)
        y = ctx.typed(plan.dtype).Reshape(product, np.array([*keep, plan.bins, plan.out_channels], np.int64))
        if moved:
            y = ctx.typed(plan.dtype).Transpose(y, perm=[int(i) for i in np.argsort(perm)])
        return [y]


def _static_input(node: gs.Node, index: int, resolver: ValueResolver, default: int) -> int | None:
    if len(node.inputs) <= index or is_omitted(node.inputs[index]):
        return default
    value = resolver.resolve(node.inputs[index])
    return None if value is None or value.size != 1 else int(value.reshape(()))


def _unsupported_mode(plan: DftPlan) -> str | None:
    if plan.onesided and not plan.inverse and plan.channels != 1:
        return "a one-sided forward DFT needs real input (ONNX Runtime rejects complex input)"
    if plan.onesided and plan.inverse:
        if plan.channels != 2:
            return "a one-sided inverse DFT (IRFFT) needs complex input"
        if plan.length != plan.dft_length // 2 + 1:
            return (
                f"IRFFT of {plan.length} bins to {plan.dft_length} points: ONNX Runtime disagrees with the ONNX spec "
                f"unless the input has dft_length // 2 + 1 = {plan.dft_length // 2 + 1} bins"
            )
    size = plan.length * plan.channels * plan.bins * plan.out_channels * plan.dtype.itemsize
    if size > MAX_DFT_MATRIX_BYTES:
        return f"the DFT matrix would take {size} bytes (limit MAX_DFT_MATRIX_BYTES = {MAX_DFT_MATRIX_BYTES})"
    return None


def dft_matrix(plan: DftPlan) -> np.ndarray:
    """``W[(n, c_in), (k, c_out)]`` in float64 such that ``y = x @ W`` is the DFT of the plan."""
    n_points, length, bins = plan.dft_length, plan.length, plan.bins
    w = np.zeros((length, plan.channels, bins, plan.out_channels), np.float64)
    used = min(length, n_points if not (plan.onesided and plan.inverse) else n_points // 2 + 1)
    n = np.arange(used)[:, None]
    k = np.arange(bins)[None, :]
    theta = 2.0 * np.pi * ((n * k) % n_points) / n_points  # reduced modulo N: exact angles for large n * k
    cos, sin = np.cos(theta), np.sin(theta)
    # cos(pi/2) is 6e-17 in float64, not 0; no true entry is that small (the least is sin(2*pi/N) ~ 6/N).
    cos[np.abs(cos) < 1e-12], sin[np.abs(sin) < 1e-12] = 0.0, 0.0
    if plan.onesided and plan.inverse:
        # IRFFT: input row n is bin n, output column k is sample k. Bins 1..N/2-1 stand for themselves and their
        # conjugate mirror (weight 2); the real part of X e^{j theta} is Xr cos - Xi sin, so the imaginary parts of
        # bin 0 and of the Nyquist bin drop out, as in numpy, PyTorch and the ONNX reference.
        weight = np.where((n == 0) | (2 * n == n_points), 1.0, 2.0)
        w[:used, 0, :, 0] = weight * cos
        w[:used, 1, :, 0] = -weight * sin
        return (w / n_points).reshape(length * plan.channels, bins)
    sign = 1.0 if plan.inverse else -1.0  # e^{sign * j * theta}
    w[:used, 0, :, 0], w[:used, 0, :, 1] = cos, sign * sin
    if plan.channels == 2:  # (xr + j xi)(cos + j s sin) = (xr cos - xi s sin) + j (xr s sin + xi cos)
        w[:used, 1, :, 0], w[:used, 1, :, 1] = -sign * sin, cos
    if plan.inverse:
        w /= n_points
    return w.reshape(length * plan.channels, bins * 2)
