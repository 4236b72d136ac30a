"""``LayerNormalization`` whose ``Mean`` or ``InvStdDev`` output is used (PyTorch's ``native_layer_norm`` returns
both), which TensorRT's parser rejects ("doesn't support more than 1 outputs for LayerNormalization nodes").

The node keeps computing ``Y`` with its one output; the statistics are computed beside it as the ONNX definition
states them, in the stash type (``stash_type=1``: float32): ``Mean = ReduceMean(X)`` and ``InvStdDev =
1 / Sqrt(ReduceMean((X - Mean)^2) + epsilon)`` over the axes from ``axis`` to the last, kept as size-1 axes.
These are the definition's own operations (the two-pass variance, as PyTorch computes it); ONNX Runtime's kernel
takes ``E[X^2] - Mean^2`` instead, so the rewrite is closer to PyTorch than the original, and equal to it within
float rounding. Dynamic shapes are kept (the axes are counted from the rank, which is known).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import dtype_of, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule

_FLOAT_TYPES = frozenset({"float32", "float16", "float64"})


@dataclass(frozen=True)
class StatsPlan:
    """The normalized axes, epsilon, and the types: the input's, the stash's and each statistic's."""

    axes: tuple[int, ...]
    epsilon: float
    dtype: np.dtype
    stash: np.dtype
    outputs: tuple[np.dtype | None, ...]  # Mean, InvStdDev dtypes (None: that output is not used)


class LayerNormStatistics(RewriteRule[StatsPlan]):
    """``Y, Mean, InvStdDev = LayerNormalization(X, ...)`` -> ``Y = LayerNormalization(X, ...)`` and the statistics
    by ReduceMean, Sub, Mul, Add, Sqrt and Reciprocal (module doc)."""

    name = "layer_norm_statistics"
    ops = frozenset({"LayerNormalization"})

    def check(self, node: gs.Node, facts: Facts) -> StatsPlan | str:
        """A plan when Mean or InvStdDev is used and the input's rank and type are known; else the reason."""
        used = [t if (t.outputs or id(t) in facts.graph_outputs) and t.name else None for t in node.outputs[1:]]
        if not any(t is not None for t in used):
            return "only the Y output is used"
        x = node.inputs[0]
        dtype, rank = dtype_of(x), rank_of(x)
        if str(dtype) not in _FLOAT_TYPES:
            return f"{dtype} input: rewritten for float32, float16 and float64"
        if rank is None:
            return "the input's rank is unknown"
        axis = int(node.attrs.get("axis", -1))
        if not -rank <= axis < rank:
            return f"axis {axis} is out of range for rank {rank}"
        stash_type = int(node.attrs.get("stash_type", 1))
        stash = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(stash_type))
        if str(stash) not in _FLOAT_TYPES:
            return f"stash_type {stash_type} is not a float type"
        types = tuple(None if t is None else (dtype_of(t) or stash) for t in used)
        assert dtype is not None
        axes = tuple(range(axis % rank, rank))
        return StatsPlan(axes, float(node.attrs.get("epsilon", 1e-5)), dtype, stash, types)

    def rewrite(self, plan: StatsPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Y from a one-output LayerNormalization; Mean and InvStdDev as the definition computes them."""
        node = ctx.node
        (y,) = ctx.make_node("LayerNormalization", list(node.inputs), dict(node.attrs), 1, dtype=plan.dtype)
        op = ctx.typed(plan.stash)
        x = node.inputs[0]
        if plan.stash != plan.dtype:
            x = op.Cast(x, to=_onnx_type(plan.stash))
        axes = ctx.constant(np.array(plan.axes, np.int64), "axes")
        mean = op.ReduceMean(x, axes, keepdims=1)
        centered = op.Sub(x, mean)
        variance = op.ReduceMean(op.Mul(centered, centered), axes, keepdims=1)
        epsilon = ctx.constant(np.array([plan.epsilon], plan.stash), "epsilon")
        inv_std = op.Reciprocal(op.Sqrt(op.Add(variance, epsilon)))
        outputs = [y]
        for value, old, dtype in zip((mean, inv_std), node.outputs[1:], plan.outputs, strict=False):
            if dtype is None:
                outputs.append(old)  # not used: left to the cleanup
            elif dtype != plan.stash:
                outputs.append(ctx.typed(dtype).Cast(value, to=_onnx_type(dtype)))
            else:
                outputs.append(value)
        return outputs


def _onnx_type(dtype: np.dtype) -> int:
    return int(onnx.helper.np_dtype_to_tensor_dtype(dtype))
