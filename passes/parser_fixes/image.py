"""CenterCropPad as Slice and Pad, and AffineGrid as a constant base grid times theta (MatMul); both need the
target sizes as constants and the affected input dimensions static. The parser rejects both ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import ValueResolver, dtype_of, rank_of, static_shape
from passes.rules import Facts, RewriteContext, RewriteRule

#: Types of the replacements: Pad (and MatMul) take float and int32/int64 in the parser; Slice also bool. float64
#: is included because the parser casts DOUBLE down to FLOAT.
_PAD_TYPES = frozenset({"float32", "float16", "bfloat16", "float64", "int32", "int64"})
_SLICE_TYPES = _PAD_TYPES | {"bool"}
_MATMUL_TYPES = frozenset({"float32", "float16", "float64"})  # a bfloat16 base grid has no numpy constant here


@dataclass(frozen=True)
class CropPadPlan:
    """CenterCropPad with static shapes: the Slice of the cropped axes and the Pad of the padded ones."""

    axes: tuple[int, ...]  # cropped axes
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends for every axis; all zero when nothing is padded


class CenterCropPadToSlicePad(RewriteRule[CropPadPlan]):
    """``CenterCropPad`` -> ``Slice`` (axes that shrink) and ``Pad`` with zeros (axes that grow).

    Per axis, as ONNX Runtime and the ONNX reference do it: cropping drops ``(dim - size) // 2`` elements at the
    start and the rest at the end; padding adds ``(size - dim) // 2`` zeros at the start and the rest at the end.
    Needs ``shape`` constant and the input's dimensions on ``axes`` static; the others may be dynamic.
    """

    name = "center_crop_pad_to_slice_pad"
    ops = frozenset({"CenterCropPad"})

    def check(self, node: gs.Node, facts: Facts) -> CropPadPlan | str:
        """A plan when rank, shape and target sizes are static; else the reason."""
        x = node.inputs[0]
        rank, dtype = rank_of(x), dtype_of(x)
        if rank is None:
            return "input rank unknown"
        sizes = ValueResolver(facts.opset).resolve(node.inputs[1])
        if sizes is None:
            return "shape is not a constant"
        axes = [a + rank if a < 0 else a for a in node.attrs.get("axes", range(rank))]
        if len(axes) != sizes.size or not all(0 <= a < rank for a in axes):
            return f"shape has {sizes.size} values for axes {axes} of a rank-{rank} input"
        dims = [x.shape[a] for a in axes]
        if not all(isinstance(d, int | np.integer) for d in dims):
            return f"input dimensions {dims} on the cropped or padded axes are not static"
        targets = list(zip(axes, dims, sizes.tolist(), strict=True))
        crop = [(a, (d - s) // 2, (d - s) // 2 + s) for a, d, s in targets if s < d]
        pads = [0] * (2 * rank)
        for a, d, s in targets:
            if s > d:
                pads[a], pads[rank + a] = (s - d) // 2, s - d - (s - d) // 2
        allowed = _PAD_TYPES if any(pads) else _SLICE_TYPES
        if str(dtype) not in allowed:
            return f"{dtype} input: the parser's {'Pad' if any(pads) else 'Slice'} does not take it"
        return CropPadPlan(*_columns(crop), tuple(pads))

    def rewrite(self, plan: CropPadPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Slice the cropped axes, then Pad the padded ones (centred as CenterCropPad centres)."""
        y: gs.Tensor = ctx.node.inputs[0]
        dtype = dtype_of(y)
        if plan.axes:
            starts, ends, axes = (np.array(v, np.int64) for v in (plan.starts, plan.ends, plan.axes))
            y = ctx.typed(dtype).Slice(y, starts, ends, axes)
        if any(plan.pads):
            y = ctx.typed(dtype).Pad(y, np.array(plan.pads, np.int64), mode="constant")
        return [y]


def _columns(crop: list[tuple[int, int, int]]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    if not crop:
        return (), (), ()
    axes, starts, ends = zip(*crop, strict=True)
    return tuple(axes), tuple(starts), tuple(ends)


@dataclass(frozen=True)
class AffineGridPlan:
    """AffineGrid with a static size: the spatial sizes, align_corners and the dtype of the base grid."""

    spatial: tuple[int, ...]  # (H, W) or (D, H, W)
    align_corners: bool
    dtype: np.dtype


class AffineGridToMatMul(RewriteRule[AffineGridPlan]):
    """``AffineGrid`` -> ``Transpose(theta)`` and ``MatMul`` with the constant base grid, ``Reshape``.

    The base grid has one row ``(x, y[, z], 1)`` per output location (x along the last axis), with the coordinates
    of ``align_corners`` (-1 and 1 at the corner centres, or at the corner edges); ``grid = base @ theta^T``.
    Needs ``size`` constant. Left: a spatial size of 1 with ``align_corners=1``, where ONNX Runtime, the ONNX
    reference and PyTorch give three different answers.
    """

    name = "affine_grid_to_matmul"
    ops = frozenset({"AffineGrid"})

    def check(self, node: gs.Node, facts: Facts) -> AffineGridPlan | str:
        """A plan when theta's type is supported and the size is a constant; else the reason."""
        theta = node.inputs[0]
        dtype = dtype_of(theta)
        if str(dtype) not in _MATMUL_TYPES:
            return f"{dtype} theta: the base grid is built as float32, float16 or float64 only"
        size = ValueResolver(facts.opset).resolve(node.inputs[1])
        if size is None or size.ndim != 1 or size.size not in (4, 5):
            return "size is not a constant of 4 or 5 values"
        spatial = tuple(int(s) for s in size[2:])
        align = bool(node.attrs.get("align_corners", 0))
        if align and 1 in spatial:
            return "a spatial size of 1 with align_corners=1 (ONNX Runtime, ONNX reference and PyTorch disagree)"
        shape = static_shape(theta)
        if shape is not None and shape[1:] != (len(spatial), len(spatial) + 1):
            return f"theta of shape {shape} does not fit a {len(spatial)}-D grid"
        assert dtype is not None
        return AffineGridPlan(spatial, align, dtype)

    def rewrite(self, plan: AffineGridPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """The constant base grid times theta (MatMul), reshaped to the grid's shape."""
        theta_t = ctx.typed(plan.dtype).Transpose(ctx.node.inputs[0], perm=[0, 2, 1])
        base = ctx.constant(base_grid(plan.spatial, plan.align_corners).astype(plan.dtype), "base_grid")
        grid = ctx.typed(plan.dtype).MatMul(base, theta_t)  # [P, k+1] @ [N, k+1, k] -> [N, P, k]
        shape = np.array([0, *plan.spatial, len(plan.spatial)], np.int64)  # 0: N, whatever it is
        return [ctx.typed(plan.dtype).Reshape(grid, shape)]


def base_grid(spatial: tuple[int, ...], align_corners: bool) -> np.ndarray:
    """``[prod(spatial), k + 1]`` rows ``(x, y[, z], 1)`` in float64, the last spatial axis varying fastest."""
    axes = [_coordinates(n, align_corners) for n in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # mesh[i] varies along spatial axis i
    columns = [m.reshape(-1) for m in reversed(mesh)]  # x first: the last spatial axis
    return np.stack([*columns, np.ones(columns[0].shape)], axis=1)


def _coordinates(n: int, align_corners: bool) -> np.ndarray:
    if align_corners:
        return np.linspace(-1.0, 1.0, n)
    return (2.0 * np.arange(n) + 1.0) / n - 1.0
