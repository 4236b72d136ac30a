"""MaxPool with its ``Indices`` output or with dilations, which TensorRT's parser rejects ("doesn't support more
than 1 outputs for MaxPool nodes", "does not support dilations other than 1"), computed from the gathered windows.

PyTorch exports ``max_pool*d(return_indices=True)``, ``adaptive_max_pool*d`` and the ``max_unpool`` round trip
as a MaxPool with ``Indices``, minus the indices of a 1x1 MaxPool (the offset of each batch-channel plane), and
copies the pooling's dilations onto both.

The windows are one constant-index ``Gather`` of the input with its spatial axes flattened (``[N, C, K, O]`` for K
window positions and O output positions), positions in the padding masked. The values ``Y``: a one-output MaxPool
when the window is not dilated, else ``ReduceMax`` over the window (padding as -inf). The indices: the first window
position whose input equals ``Y``, by ``Where(x == Y, index, BIG)`` then ``ReduceMin`` over the window: the
smallest matching index is the first in the window's scan order, which is ONNX Runtime's choice (it keeps the
first maximum, replacing it only with a strictly greater value) and PyTorch's. The index is over the whole tensor
as ONNX defines it (``storage_order=0``): ``(n * C + c) * prod(spatial) + spatial index``.

Exact for every input without NaN (values are gathered, compared and selected, none computed). Where a window
holds a NaN the original disagrees with itself across runtimes (ONNX Runtime skips NaN, PyTorch returns it); the
rewrite then gives an index outside the plane. Needs static spatial input dimensions (the window table is a
constant); batch and channels may be dynamic.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import dtype_of, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule

_FLOAT_TYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
#: The window table holds K * O indices; past this it is declined rather than baked into the graph.
MAX_TABLE = 1 << 22


@dataclass(frozen=True)
class WindowPlan:
    """The window table of one MaxPool: input index and validity per (window position, output position)."""

    table: np.ndarray  # int64 [K, O]: the spatial flat index read at each window position (0 where masked)
    valid: np.ndarray | None  # bool [K, O], None when every position is inside the input
    plane: int  # prod(input spatial): the index stride of one batch-channel plane
    out_spatial: tuple[int, ...]
    planes: tuple[int, int] | None  # (N, C) when static: the plane offsets are a constant
    dtype: np.dtype
    dilated: bool  # the values too come from the gathered windows (the parser takes no dilated MaxPool)
    indices: bool  # the Indices output is used


class MaxPoolByWindows(RewriteRule[WindowPlan]):
    """``Y, I = MaxPool(X)`` -> ``Y = MaxPool(X)`` (dilated: the max of the gathered windows), ``I`` = the first
    window position where ``X == Y`` (module doc)."""

    name = "max_pool_by_windows"
    ops = frozenset({"MaxPool"})

    def check(self, node: gs.Node, facts: Facts) -> WindowPlan | str:
        """A plan when the Indices output is used and the spatial shape is static; else the reason."""
        indices_used = len(node.outputs) > 1 and _is_used(node.outputs[1], facts)
        dilated = any(int(d) != 1 for d in node.attrs.get("dilations", []))
        if not indices_used and not dilated:
            return "the Indices output is not used and the window is not dilated"
        x = node.inputs[0]
        dtype, rank = dtype_of(x), rank_of(x)
        if str(dtype) not in _FLOAT_TYPES:
            return f"{dtype} input: rewritten for floating-point types"
        if rank is None or rank < 3:
            return "the input's rank is unknown"
        spatial = x.shape[2:]
        if not all(isinstance(d, int | np.integer) and d > 0 for d in spatial):
            return f"the input's spatial shape {list(spatial)} is not static"
        if int(node.attrs.get("storage_order", 0)) != 0:
            return "storage_order=1 (column-major indices) is not rewritten"
        auto_pad = node.attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad not in ("NOTSET", "VALID"):
            return f"auto_pad {auto_pad} is not rewritten (explicit pads are)"
        window = _Window.of(node, tuple(int(d) for d in spatial), auto_pad == "VALID")
        out_spatial = _static(node.outputs[0].shape, 2) or window.out_spatial()
        if min(out_spatial, default=0) < 1:
            return f"empty output {out_spatial}"
        count = int(np.prod(window.kernel)) * int(np.prod(out_spatial))
        if count > MAX_TABLE:
            return f"the window table would hold {count} indices (more than {MAX_TABLE})"
        table, valid = window.table(out_spatial)
        planes = _static(x.shape[:2], 0)
        assert dtype is not None
        return WindowPlan(
            table,
            None if valid.all() else valid,
            int(np.prod(spatial)),
            out_spatial,
            (planes[0], planes[1]) if planes else None,
            dtype,
            dilated,
            indices_used,
        )

    def rewrite(self, plan: WindowPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Y by a one-output MaxPool (or, dilated, the windows' ReduceMax); Indices by Gather, Equal, Where and
        ReduceMin (module doc)."""
        node, op, i64 = ctx.node, ctx.typed(plan.dtype), ctx.typed(np.int64)
        x = node.inputs[0]
        flat = op.Reshape(x, np.array([0, 0, -1], np.int64))
        windows = op.Gather(flat, ctx.constant(plan.table, "window_table"), axis=2)  # [N, C, K, O]
        window_axis = ctx.constant(np.array([2], np.int64), "window_axis")
        out_shape = np.array([0, 0, *plan.out_spatial], np.int64)
        if plan.dilated:
            inside = windows
            if plan.valid is not None:
                low = ctx.constant(np.array([-np.inf], plan.dtype), "padding")
                inside = op.Where(ctx.constant(plan.valid, "window_valid"), windows, low)
            peak = op.ReduceMax(inside, window_axis, keepdims=1)  # [N, C, 1, O]
            values = op.Reshape(peak, out_shape)
        else:
            (values,) = ctx.make_node("MaxPool", [x], dict(node.attrs), 1, dtype=plan.dtype)
            peak = op.Reshape(values, np.array([0, 0, 1, -1], np.int64))  # [N, C, 1, O]
        if not plan.indices:
            return [values, *node.outputs[1:]]
        hit = ctx.typed(np.bool_).Equal(windows, peak)
        if plan.valid is not None:
            hit = ctx.typed(np.bool_).And(hit, ctx.constant(plan.valid, "window_valid"))
        never = ctx.constant(np.array([np.iinfo(np.int64).max], np.int64), "no_match")
        found = i64.Where(hit, ctx.constant(plan.table, "window_index"), never)
        first = i64.ReduceMin(found, window_axis, keepdims=0)  # [N, C, O]
        indices = i64.Add(first, _plane_offsets(plan, x, ctx))
        return [values, i64.Reshape(indices, out_shape)]


@dataclass(frozen=True)
class _Window:
    """A pooling window's geometry on a static spatial shape."""

    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends
    ceil_mode: bool

    @classmethod
    def of(cls, node: gs.Node, spatial: tuple[int, ...], valid_padding: bool) -> _Window:
        n = len(spatial)
        kernel = tuple(int(k) for k in node.attrs["kernel_shape"])
        pads = (0,) * 2 * n if valid_padding else tuple(int(p) for p in node.attrs.get("pads", [0] * 2 * n))
        return cls(
            spatial,
            kernel,
            tuple(int(s) for s in node.attrs.get("strides", [1] * n)),
            tuple(int(d) for d in node.attrs.get("dilations", [1] * n)),
            pads,
            bool(node.attrs.get("ceil_mode", 0)),
        )

    def out_spatial(self) -> tuple[int, ...]:
        """ONNX's output size, with ceil_mode's last window dropped when it starts in the end padding."""
        n, sizes = len(self.spatial), []
        for i in range(n):
            span = self.spatial[i] + self.pads[i] + self.pads[n + i] - ((self.kernel[i] - 1) * self.dilations[i] + 1)
            size = (-(-span // self.strides[i]) if self.ceil_mode else span // self.strides[i]) + 1
            if self.ceil_mode and (size - 1) * self.strides[i] >= self.spatial[i] + self.pads[i]:
                size -= 1
            sizes.append(size)
        return tuple(sizes)

    def table(self, out_spatial: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """``[K, O]`` spatial flat indices and their validity, K in the window's scan order (row-major)."""
        n = len(self.spatial)
        offsets = np.array(list(itertools.product(*(range(k) for k in self.kernel))), np.int64).reshape(-1, n)
        outputs = np.array(list(itertools.product(*(range(o) for o in out_spatial))), np.int64).reshape(-1, n)
        strides, dilations = np.array(self.strides), np.array(self.dilations)
        begins = np.array(self.pads[:n])
        positions = outputs[None, :, :] * strides - begins + offsets[:, None, :] * dilations  # [K, O, n]
        valid = np.all((positions >= 0) & (positions < np.array(self.spatial)), axis=-1)
        flat = np.ravel_multi_index(tuple(np.clip(positions, 0, np.array(self.spatial) - 1).T), self.spatial).T
        return np.where(valid, flat, 0).astype(np.int64), valid


def _plane_offsets(plan: WindowPlan, x: gs.Tensor, ctx: RewriteContext) -> gs.Tensor:
    """``[N, C, 1]``: ``(n * C + c) * plane``; a constant when N and C are static, else Range over Shape."""
    if plan.planes is not None:
        n, c = plan.planes
        return ctx.constant(np.arange(n * c, dtype=np.int64).reshape(n, c, 1) * plan.plane, "plane_offsets")
    i64 = ctx.typed(np.int64)
    planes = i64.Shape(x, start=0, end=2)
    count = i64.ReduceProd(planes, keepdims=0)
    step = np.array(plan.plane, np.int64)
    offsets = i64.Range(np.array(0, np.int64), i64.Mul(count, step), step)
    return i64.Reshape(offsets, i64.Concat(planes, np.array([1], np.int64), axis=0))


def _is_used(tensor: gs.Tensor, facts: Facts) -> bool:
    return bool(tensor.outputs) or id(tensor) in facts.graph_outputs


def _static(shape: object, start: int) -> tuple[int, ...] | None:
    if shape is None:
        return None
    dims = list(shape)[start:]  # type: ignore[call-overload]
    if not all(isinstance(d, int | np.integer) for d in dims):
        return None
    return tuple(int(d) for d in dims)
