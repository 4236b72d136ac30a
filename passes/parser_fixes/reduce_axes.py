"""Reduce ``axes`` moved into initializers: TensorRT's parser reads a Reduce op's axes only from an initializer.

The ``axes`` input exists for ReduceSum from opset 13 and for every Reduce op from opset 18. When it is a
``Constant`` node's output, or shape arithmetic on static shapes (``Shape -> Gather -> ...``), its value is
computed here and the node reads it as a ``gs.Constant`` (exported as an initializer) named ``<node>/axes``.
The node itself is kept: same op, attributes and other inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import ValueResolver, is_omitted
from passes.rules import Facts, RewriteContext, RewriteRule

REDUCE_OPS = frozenset(
    {
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceSumSquare",
    }
)  # fmt: skip


@dataclass(frozen=True)
class AxesPlan:
    """The Reduce node's axes, to be moved into an initializer."""

    axes: np.ndarray


class ReduceAxesToInitializers(RewriteRule[AxesPlan]):
    """Give every Reduce node whose ``axes`` input is computable but not an initializer that value as one."""

    name = "reduce_axes_to_initializers"
    ops = REDUCE_OPS

    def check(self, node: gs.Node, facts: Facts) -> AxesPlan | str:
        """The axes to bake in, or why the node is left (no axes input, already constant, not computable)."""
        if len(node.inputs) < 2 or is_omitted(node.inputs[1]):
            return "no axes input (axes is an attribute before opset 18, or omitted)"
        axes = node.inputs[1]
        if isinstance(axes, gs.Constant):
            return "axes is already an initializer"
        value = facts.memo("value_resolver", lambda: ValueResolver(facts.opset)).resolve(axes)
        if value is None:
            return f"axes {axes.name!r} is not computable before running the graph (a dynamic shape or an input)"
        if not np.issubdtype(value.dtype, np.integer) or value.ndim != 1:
            return f"axes {axes.name!r} resolves to a {value.dtype} array of rank {value.ndim}, not 1-D integers"
        return AxesPlan(value.astype(np.int64))

    def rewrite(self, plan: AxesPlan, ctx: RewriteContext) -> None:
        """The node reads the axes from a new initializer ``<node>/axes``; it is kept (edited in place)."""
        ctx.node.inputs[1] = ctx.constant(plan.axes, "axes")
