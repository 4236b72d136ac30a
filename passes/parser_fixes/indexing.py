"""MaxUnpool as ScatterElements into a flattened zero tensor, and Compress with a constant condition as Gather of
the constant indices (the parser rejects both; it accepts ScatterElements, Gather and ConstantOfShape)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import ValueResolver, dtype_of, is_omitted, rank_of, static_shape
from passes.rules import Facts, RewriteContext, RewriteRule

_SCATTER_TYPES = frozenset({"float32", "float16", "float64"})  # MaxUnpool is float-only; the zero needs numpy
#: Gather takes float, int32/int64 and bool in the parser (float64 is cast down); moving data needs no constant.
_GATHER_TYPES = frozenset({"float32", "float16", "bfloat16", "float64", "int32", "int64", "bool"})


@dataclass(frozen=True)
class MaxUnpoolPlan:
    """MaxUnpool with a static output shape: the size of the flattened zero tensor the values are scattered into."""

    output_shape: tuple[int, ...]
    dtype: np.dtype


class MaxUnpoolToScatter(RewriteRule[MaxUnpoolPlan]):
    """``MaxUnpool`` -> ``ScatterElements(ConstantOfShape([size]) = 0, Reshape(I, [-1]), Reshape(X, [-1]))``,
    ``Reshape`` to the output shape.

    MaxUnpool's indices address the flattened output (batch and channel included, as MaxPool writes them), which
    is exactly a scatter on axis 0 of the flattened output. The output shape is ``output_shape`` when given (a
    constant), else ``(in - 1) * stride + kernel - pad_begin - pad_end`` per spatial axis; the input's shape must
    be static. Indices repeated by overlapping pooling windows carry the same value, so the order of the writes
    does not matter.
    """

    name = "max_unpool_to_scatter"
    ops = frozenset({"MaxUnpool"})

    def check(self, node: gs.Node, facts: Facts) -> MaxUnpoolPlan | str:
        """A plan when the type is supported and the output shape is static; else the reason."""
        x = node.inputs[0]
        dtype, shape = dtype_of(x), static_shape(x)
        if str(dtype) not in _SCATTER_TYPES:
            return f"{dtype} input: rewritten for float32, float16 and float64"
        if shape is None or len(shape) < 3:
            return "the input's shape is not static"
        if len(node.inputs) > 2 and not is_omitted(node.inputs[2]):
            given = ValueResolver(facts.opset).resolve(node.inputs[2])
            if given is None or given.size != len(shape):
                return "output_shape is not a constant of the input's rank"
            output_shape = tuple(int(d) for d in given.tolist())
        else:
            output_shape = shape[:2] + _default_spatial(node, shape[2:])
        if min(output_shape) < 1:
            return f"empty output shape {output_shape}"
        assert dtype is not None
        return MaxUnpoolPlan(output_shape, dtype)

    def rewrite(self, plan: MaxUnpoolPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Scatter the values at their indices into a flattened zero tensor, then Reshape to the output shape."""
        x, indices = ctx.node.inputs[0], ctx.node.inputs[1]
        size = np.array([int(np.prod(plan.output_shape))], np.int64)
        zero = ctx.constant(np.zeros(1, plan.dtype), "zero")
        zeros = ctx.typed(plan.dtype).ConstantOfShape(size, value=zero)
        flat = np.array([-1], np.int64)
        values = ctx.typed(plan.dtype).Reshape(x, flat)
        where = ctx.typed(np.dtype(np.int64)).Reshape(indices, flat)
        scattered = ctx.typed(plan.dtype).ScatterElements(zeros, where, values, axis=0)
        return [ctx.typed(plan.dtype).Reshape(scattered, np.array(plan.output_shape, np.int64))]


def _default_spatial(node: gs.Node, spatial: tuple[int, ...]) -> tuple[int, ...]:
    n = len(spatial)
    kernel = list(node.attrs.get("kernel_shape", [1] * n))
    strides = list(node.attrs.get("strides", [1] * n))
    pads = list(node.attrs.get("pads", [0] * 2 * n))
    return tuple((spatial[i] - 1) * strides[i] + kernel[i] - pads[i] - pads[n + i] for i in range(n))


@dataclass(frozen=True)
class CompressPlan:
    """Compress with a constant condition: the kept positions and the axis (None: flattened)."""

    indices: np.ndarray  # int64, the positions where the condition is true
    axis: int | None  # None: the input is flattened first


class CompressToGather(RewriteRule[CompressPlan]):
    """``Compress`` with a constant condition -> ``Gather`` of the condition's true positions (after a flattening
    ``Reshape`` when there is no ``axis``). A condition shorter than the axis drops the rest, as in ONNX; one
    longer than a static axis is left (an error at run time)."""

    name = "compress_to_gather"
    ops = frozenset({"Compress"})

    def check(self, node: gs.Node, facts: Facts) -> CompressPlan | str:
        """A plan when the condition is a 1-D constant and the type is one Gather takes; else the reason."""
        x = node.inputs[0]
        dtype = dtype_of(x)
        if str(dtype) not in _GATHER_TYPES:
            return f"{dtype} input: the parser's Gather does not take it"
        condition = ValueResolver(facts.opset).resolve(node.inputs[1])
        if condition is None or condition.ndim != 1:
            return "condition is not a 1-D constant"
        axis = node.attrs.get("axis")
        shape = static_shape(x)
        if axis is None:
            limit = None if shape is None else int(np.prod(shape))
        else:
            rank = rank_of(x)
            dim = None if rank is None or not -rank <= axis < rank else x.shape[axis]
            limit = int(dim) if isinstance(dim, int | np.integer) else None
        if limit is not None and condition.size > limit:
            return f"condition has {condition.size} entries for {limit} slices"
        return CompressPlan(np.flatnonzero(condition.astype(bool)).astype(np.int64), axis)

    def rewrite(self, plan: CompressPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Gather the kept positions (after flattening when there is no axis)."""
        x = ctx.node.inputs[0]
        dtype = dtype_of(x)
        if plan.axis is None:
            x = ctx.typed(dtype).Reshape(x, np.array([-1], np.int64))
        indices = ctx.constant(plan.indices, "indices")
        return [ctx.typed(dtype).Gather(x, indices, axis=0 if plan.axis is None else plan.axis)]
