"""Reduce ``axes`` moved into initializers: TensorRT's parser reads a Reduce op's axes only from an initializer.

The ``axes`` input exists for ReduceSum from opset 13 and for every Reduce op from opset 18. When it is a
``Constant`` node's output, or shape arithmetic on static shapes (``Shape -> Gather -> ...``), its value is
computed here and the node reads it as a ``gs.Constant`` (exported as an initializer) named ``<node>/axes``.
The node itself is kept: same op, attributes and other inputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import STANDARD_DOMAINS, PassResult
from passes.parser_fixes.values import ValueResolver, is_omitted

logger = logging.getLogger(__name__)

REDUCE_OPS = frozenset(
    {
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceSumSquare",
    }
)  # fmt: skip


@dataclass(frozen=True)
class AxesPlan:
    axes: np.ndarray


class ReduceAxesToInitializers:
    """Give every Reduce node whose ``axes`` input is computable but not an initializer that value as one."""

    name = "reduce_axes_to_initializers"

    def check(self, node: gs.Node, graph: gs.Graph, resolver: ValueResolver | None = None) -> AxesPlan | str:
        """The axes to bake in, or why the node is left (no axes input, already constant, not computable)."""
        if len(node.inputs) < 2 or is_omitted(node.inputs[1]):
            return "no axes input (axes is an attribute before opset 18, or omitted)"
        axes = node.inputs[1]
        if isinstance(axes, gs.Constant):
            return "axes is already an initializer"
        value = (resolver or ValueResolver(graph.opset)).resolve(axes)
        if value is None:
            return f"axes {axes.name!r} is not computable before running the graph (a dynamic shape or an input)"
        if not np.issubdtype(value.dtype, np.integer) or value.ndim != 1:
            return f"axes {axes.name!r} resolves to a {value.dtype} array of rank {value.ndim}, not 1-D integers"
        return AxesPlan(value.astype(np.int64))

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        resolver = ValueResolver(graph.opset)
        taken: set[str] | None = None
        moved = 0
        for node in graph.nodes:
            if node.op not in REDUCE_OPS or node.domain not in STANDARD_DOMAINS:
                continue
            plan = self.check(node, graph, resolver)
            if isinstance(plan, str):
                if len(node.inputs) > 1 and isinstance(node.inputs[1], gs.Variable) and node.inputs[1].name:
                    logger.info("%s: left %s node %r: %s", self.name, node.op, node.name, plan)
                continue
            if taken is None:
                taken = set(graph.tensors())
            name, i = f"{node.name}/axes", 0
            while name in taken:
                i += 1
                name = f"{node.name}/axes_{i}"
            taken.add(name)
            node.inputs[1] = gs.Constant(name, plan.axes)
            moved += 1
        if moved:
            graph.cleanup(remove_unused_graph_inputs=False)  # the Constant nodes and arithmetic that fed axes
        return PassResult(graph, moved > 0)
