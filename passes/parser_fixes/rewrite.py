"""The skeleton every parser-fix pass shares: find nodes of some ops, ``check`` each (pure: a plan, or the reason
the node is left), ``rewrite`` the accepted ones with a :class:`Builder` that names everything it creates after the
replaced node (``<node>/<Op>``, ``<node>/<hint>``), so reports can match them up.

A node a pass leaves stays in the graph unchanged; the static compatibility check reports it. ``check`` is public
so that report can say why the pass left it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import onnx_graphsurgeon as gs

from converters.context import unique_name
from converters.errors import ConversionError
from converters.settings import Settings
from passes.base import STANDARD_DOMAINS, PassResult

logger = logging.getLogger(__name__)

#: Domains whose nodes are standard ONNX ops (graph-surgeon reads an absent domain as "" or None).

Plan = TypeVar("Plan")


class Builder:
    """Creates nodes and constants for the rewrite of ``node``, all named after it.

    ``build.op("Mul", x, np.int64(2))`` adds a node and returns its output; numpy values become constants.
    ``build.finish(results)`` makes the results take the place of the node's outputs (names, types and
    consumers), so graph outputs and downstream nodes never see a rename.
    """

    def __init__(self, graph: gs.Graph, node: gs.Node, taken: set[str]) -> None:
        self.graph = graph
        self.node = node
        self.created: list[gs.Node] = []
        self._taken = taken
        # A nameless node (hand-written ONNX) lends the name of its first output instead.
        self._base = node.name or (node.outputs[0].name if node.outputs else node.op)

    def fresh_name(self, hint: str) -> str:
        return unique_name(f"{self._base}/{hint}", self._taken)

    def const(self, value: Any, hint: str = "const") -> gs.Constant:
        return gs.Constant(self.fresh_name(hint), np.ascontiguousarray(np.asarray(value)))

    def op(
        self,
        op_type: str,
        *inputs: gs.Tensor | np.ndarray | np.generic,
        dtype: Any = None,
        **attrs: Any,
    ) -> gs.Variable:
        tensors = [t if isinstance(t, gs.Tensor) else self.const(t, f"{op_type}_const") for t in inputs]
        out = gs.Variable(self.fresh_name(f"{op_type}_out"), dtype=dtype)
        node = gs.Node(op_type, self.fresh_name(op_type), attrs=attrs, inputs=tensors, outputs=[out])
        self.graph.nodes.append(node)
        self.created.append(node)
        return out

    def finish(self, results: Sequence[gs.Tensor]) -> None:
        """Put ``results`` in place of the node's outputs and detach the node (cleanup removes it)."""
        olds = list(self.node.outputs)
        if len(olds) != len(results):
            raise ConversionError(
                f"the rewrite gave {len(results)} outputs for the node's {len(olds)}",
                node=self.node.name,
                fix="a rewrite must return one tensor per output of the node it replaces, in order",
            )
        self.node.outputs.clear()
        self.node.inputs.clear()
        for old, new in zip(olds, results, strict=True):
            producer = new.inputs[0] if isinstance(new, gs.Variable) and len(new.inputs) == 1 else None
            # graph-surgeon compares tensors by name and nodes field by field: identity is what is meant here.
            movable = not new.outputs and not _contains(self.graph.outputs, new) and _contains(self.created, producer)
            if producer is not None and movable:
                # The last created node writes the old tensor itself: its name, dtype and shape survive.
                index = next(i for i, t in enumerate(producer.outputs) if t is new)
                producer.outputs[index] = old
            else:  # the result is an input, a constant or shared: an Identity keeps the old tensor produced
                node = gs.Node("Identity", self.fresh_name("Identity"), inputs=[new], outputs=[old])
                self.graph.nodes.append(node)
                self.created.append(node)


def _contains(items: Sequence[Any], item: Any) -> bool:
    return item is not None and any(x is item for x in items)


class NodeRewritePass(Generic[Plan]):
    """Rewrites every node of ``ops`` (standard domain) that ``check`` accepts; subclasses set ``name``/``ops``."""

    name: str = "node_rewrite"
    ops: frozenset[str] = frozenset()

    def check(self, node: gs.Node, graph: gs.Graph) -> Plan | str:
        """A plan for rewriting ``node``, or the reason it is left as it is. Pure: never modifies the graph."""
        raise NotImplementedError

    def rewrite(self, plan: Plan, build: Builder) -> list[gs.Tensor]:
        """Build the replacement with ``build``; return one tensor per output of the node."""
        raise NotImplementedError

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        taken: set[str] | None = None
        rewritten = 0
        for node in list(graph.nodes):
            if node.op not in self.ops or node.domain not in STANDARD_DOMAINS:
                continue
            plan = self.check(node, graph)
            if isinstance(plan, str):
                logger.info("%s: left %s node %r: %s", self.name, node.op, node.name, plan)
                continue
            if taken is None:  # built once per run, only when something is rewritten
                taken = set(graph.tensors()) | {n.name for n in graph.nodes}
            build = Builder(graph, node, taken)
            build.finish(self.rewrite(plan, build))
            logger.info("%s: rewrote %s node %r into %d nodes", self.name, node.op, node.name, len(build.created))
            rewritten += 1
        if rewritten:
            graph.cleanup(remove_unused_graph_inputs=False).toposort()
        return PassResult(graph, rewritten > 0)
