"""Dead-node and Identity cleanup, and topological sort."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import PassResult


class RemoveIdentities:
    """Bypass Identity nodes: consumers read the Identity's input directly.

    An Identity whose output is a graph output is kept, so graph output names never change.
    """

    name = "remove_identities"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        graph_outputs = {t.name for t in graph.outputs}
        removed = 0
        for node in list(graph.nodes):
            if node.op != "Identity" or node.domain not in ("", None) or len(node.inputs) != 1:
                continue
            source, target = node.inputs[0], node.outputs[0]
            if target.name in graph_outputs:
                continue
            for consumer in list(target.outputs):
                for index, tensor in enumerate(consumer.inputs):
                    if tensor is target:  # graph-surgeon's synchronised lists take item, not slice, assignment
                        consumer.inputs[index] = source
            node.outputs.clear()
            removed += 1
        if removed:
            graph.cleanup()
        return PassResult(graph, removed > 0)


class RemoveDeadNodes:
    """Remove nodes and tensors that no graph output depends on. Unused graph inputs are kept: callers feed them."""

    name = "remove_dead_nodes"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        before = len(graph.nodes)
        graph.cleanup(remove_unused_graph_inputs=False)
        return PassResult(graph, len(graph.nodes) != before)


class TopologicalSort:
    """Order nodes so every producer comes before its consumers (ONNX requires it; passes may break it)."""

    name = "toposort"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        before = [id(n) for n in graph.nodes]
        graph.toposort()
        return PassResult(graph, [id(n) for n in graph.nodes] != before)
