"""``aten::grid_sampler_3d`` (``F.grid_sample`` of a 5-D input) from ``GatherElements`` and arithmetic: TensorRT's
``GridSample`` is 2-D only. Trilinear ("bilinear") and nearest interpolation; zeros, border and reflection padding;
``align_corners`` either way; PyTorch's CPU kernel step by step (its source-index formulas, corner weights and the
order it sums the eight corners in)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.aten.numeric.linalg_steps import const, scalar
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry
from converters.settings import Settings

_BILINEAR, _NEAREST = 0, 1
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _static_5d(node: gs.Node, settings: Settings) -> bool:
    """Static 5-D input and grid shapes, a float input, and trilinear or nearest interpolation (not bicubic)."""
    shapes = [t.shape for t in node.inputs[:2]]
    static = all(s is not None and len(s) == 5 and all(isinstance(d, int) for d in s) for s in shapes)
    floating = node.inputs[0].dtype is not None and np.issubdtype(np.dtype(node.inputs[0].dtype), np.floating)
    modes = int(node.attrs.get("interpolation_mode", 0)) in (_BILINEAR, _NEAREST)
    return static and floating and modes and int(node.attrs.get("padding_mode", 0)) in (_ZEROS, _BORDER, _REFLECTION)


@dataclass(frozen=True)
class _Sampling:
    """What the converter reads from the node: sizes, modes and the dtype."""

    batch: int
    channels: int
    size: tuple[int, int, int]  # D, H, W
    points: tuple[int, int, int]  # output D, H, W
    padding: int
    align_corners: bool
    dtype: Any


class _GridSample3d(torch.nn.Module):
    def __init__(self, mode: str, padding: str, align_corners: bool) -> None:
        super().__init__()
        self.mode, self.padding, self.align_corners = mode, padding, align_corners

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.grid_sample(
            x, grid * 1.2, mode=self.mode, padding_mode=self.padding, align_corners=self.align_corners
        )


_INPUTS: list[tuple[tuple[int, ...], str]] = [((2, 3, 4, 5, 3), "float32"), ((2, 2, 3, 4, 3), "float32")]


@converter_case(lambda: _GridSample3d("bilinear", "zeros", False), inputs=_INPUTS)
@converter_case(lambda: _GridSample3d("bilinear", "border", True), inputs=_INPUTS)
@converter_case(lambda: _GridSample3d("bilinear", "reflection", False), inputs=_INPUTS)
@converter_case(lambda: _GridSample3d("nearest", "reflection", True), inputs=_INPUTS)
@converter_case(lambda: _GridSample3d("nearest", "zeros", False), inputs=_INPUTS)
def convert_grid_sampler_3d(ctx: ConverterContext) -> gs.Tensor:
    """``aten::grid_sampler_3d``: each grid point ``(x, y, z)`` (W, H, D order) becomes a source index per axis
    (unnormalised, then clipped or reflected by the padding mode); trilinear sums the eight corner voxels times
    their box weights, nearest takes the voxel at the rounded index (half to even); voxels outside the input count
    as zero. The voxels are gathered from the input flattened to ``(N, C, D*H*W)`` with ``GatherElements``."""
    plan = _plan(ctx)
    batch, channels = plan.batch, plan.channels
    depth, height, width = plan.size
    points = int(np.prod(plan.points))
    flat_input = ctx.op.Reshape(ctx.inputs[0], const(ctx, np.array([batch, channels, -1], np.int64), "flat"))
    grid = ctx.op.Reshape(ctx.inputs[1], const(ctx, np.array([batch, 1, points, 3], np.int64), "points"))
    gx, gy, gz = (ctx.op.Gather(grid, const(ctx, np.array(i, np.int64), "coordinate"), axis=3) for i in range(3))
    ix = _source_index(ctx, gx, width, plan)
    iy = _source_index(ctx, gy, height, plan)
    iz = _source_index(ctx, gz, depth, plan)

    def voxel(x: gs.Tensor, y: gs.Tensor, z: gs.Tensor) -> tuple[gs.Tensor, gs.Tensor]:
        """The gathered input at float indices ``(x, y, z)`` (``(N, C, P)``) and whether they lie inside."""
        inside = ctx.op.And(
            ctx.op.And(_within(ctx, x, width, plan.dtype), _within(ctx, y, height, plan.dtype)),
            _within(ctx, z, depth, plan.dtype),
        )
        linear = ctx.op.Add(
            ctx.op.Mul(ctx.op.Add(ctx.op.Mul(z, scalar(ctx, height, plan.dtype)), y), scalar(ctx, width, plan.dtype)), x
        )
        index = ctx.op.Where(inside, ctx.op.Cast(linear, to=7), const(ctx, np.array(0, np.int64)))
        index = ctx.op.Expand(index, const(ctx, np.array([batch, channels, points], np.int64), "expand"))
        return ctx.op.GatherElements(flat_input, index, axis=2), inside

    if int(ctx.attrs["interpolation_mode"]) == _NEAREST:
        value, inside = voxel(ctx.op.Round(ix), ctx.op.Round(iy), ctx.op.Round(iz))
        result = ctx.op.Where(inside, value, scalar(ctx, 0.0, plan.dtype))
    else:
        result = _trilinear(ctx, ix, iy, iz, voxel, plan.dtype)
    shape = np.array([batch, channels, *plan.points], np.int64)
    return ctx.op.Reshape(result, const(ctx, shape, "out_shape"))


def _plan(ctx: ConverterContext) -> _Sampling:
    batch, channels, depth, height, width = (int(d) for d in ctx.input_shapes[0])  # type: ignore[union-attr]
    grid_shape = [int(d) for d in ctx.input_shapes[1]]  # type: ignore[union-attr]
    return _Sampling(
        batch,
        channels,
        (depth, height, width),
        (grid_shape[1], grid_shape[2], grid_shape[3]),
        int(ctx.attrs["padding_mode"]),
        bool(ctx.attrs["align_corners"]),
        ctx.input_dtypes[0] or np.dtype(np.float32),
    )


def _trilinear(ctx: ConverterContext, ix: gs.Tensor, iy: gs.Tensor, iz: gs.Tensor, voxel: Any, dtype: Any) -> gs.Tensor:
    """PyTorch's trilinear sum: corners tnw, tne, tsw, tse, bnw, bne, bsw, bse (x fastest, then y, then z), each
    weighted by ``(x-weight * y-weight) * z-weight`` and added in that order where it lies inside."""
    one = scalar(ctx, 1.0, dtype)
    lows = [ctx.op.Floor(c) for c in (ix, iy, iz)]
    highs = [ctx.op.Add(low, one) for low in lows]
    # toward the low corner the weight is (high - i); toward the high one (i - low)
    weights = [(ctx.op.Sub(h, c), ctx.op.Sub(c, low)) for c, low, h in zip((ix, iy, iz), lows, highs, strict=True)]
    total: gs.Tensor | None = None
    for corner in range(8):
        picks = [(corner >> axis) & 1 for axis in range(3)]  # x, y, z: 0 low, 1 high
        coords = [highs[a] if picks[a] else lows[a] for a in range(3)]
        weight = ctx.op.Mul(ctx.op.Mul(weights[0][picks[0]], weights[1][picks[1]]), weights[2][picks[2]])
        value, inside = voxel(*coords)
        term = ctx.op.Where(inside, ctx.op.Mul(value, weight), scalar(ctx, 0.0, dtype))
        total = term if total is None else ctx.op.Add(total, term)
    assert total is not None
    return total


def _within(ctx: ConverterContext, index: gs.Tensor, size: int, dtype: Any) -> gs.Tensor:
    """``0 <= index < size`` (float indices holding whole numbers)."""
    return ctx.op.And(
        ctx.op.GreaterOrEqual(index, scalar(ctx, 0.0, dtype)), ctx.op.Less(index, scalar(ctx, float(size), dtype))
    )


def _source_index(ctx: ConverterContext, coord: gs.Tensor, size: int, plan: _Sampling) -> gs.Tensor:
    """PyTorch's ``grid_sampler_compute_source_index``: unnormalise from ``[-1, 1]``, then clip (border) or
    reflect and clip (reflection)."""
    dtype = plan.dtype
    one, two = scalar(ctx, 1.0, dtype), scalar(ctx, 2.0, dtype)
    shifted = ctx.op.Add(coord, one)
    if plan.align_corners:
        index = ctx.op.Mul(ctx.op.Div(shifted, two), scalar(ctx, float(size - 1), dtype))
    else:
        index = ctx.op.Div(ctx.op.Sub(ctx.op.Mul(shifted, scalar(ctx, float(size), dtype)), one), two)
    if plan.padding == _ZEROS:
        return index
    if plan.padding == _REFLECTION:
        low, high = (0, 2 * (size - 1)) if plan.align_corners else (-1, 2 * size - 1)
        index = _reflect(ctx, index, low, high, dtype)
    return ctx.op.Min(ctx.op.Max(index, scalar(ctx, 0.0, dtype)), scalar(ctx, float(size - 1), dtype))


def _reflect(ctx: ConverterContext, index: gs.Tensor, twice_low: int, twice_high: int, dtype: Any) -> gs.Tensor:
    """PyTorch's ``reflect_coordinates``: fold ``index`` into ``[low, high]`` by reflections at its ends. ``extra
    = in - span * floor(in / span)`` equals ``fmod(in, span)`` exactly here (Sterbenz: no rounding)."""
    if twice_low == twice_high:
        return ctx.op.Mul(index, scalar(ctx, 0.0, dtype))
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = ctx.op.Abs(ctx.op.Sub(index, scalar(ctx, low, dtype)))
    span_t = scalar(ctx, span, dtype)
    flips = ctx.op.Floor(ctx.op.Div(distance, span_t))
    extra = ctx.op.Sub(distance, ctx.op.Mul(span_t, flips))
    half = ctx.op.Div(flips, scalar(ctx, 2.0, dtype))
    even = ctx.op.Equal(ctx.op.Floor(half), half)
    forward = ctx.op.Add(extra, scalar(ctx, low, dtype))
    backward = ctx.op.Add(ctx.op.Sub(span_t, extra), scalar(ctx, low, dtype))
    return ctx.op.Where(even, forward, backward)


def register_grid3d_converters(registry: ConverterRegistry) -> None:
    """Register the ``grid_sampler_3d`` converter on ``registry``."""
    registry.register("aten::grid_sampler_3d.default", validator=_static_5d)(convert_grid_sampler_3d)
