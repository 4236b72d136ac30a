"""Dead-node and Identity cleanup, and topological sort.

graph-surgeon's ``Graph.cleanup`` and ``Graph.toposort`` give the results these passes want, but not in linear time:
detaching a dead node calls ``list.remove`` on the consumer list of each of its inputs, and every comparison there is
``Node.__eq__``, which compares names, attributes and inputs and formats a log message (a weight or an index shared by
thousands of nodes makes that quadratic), and node ids are set and deleted as attributes on every call. For a graph
without subgraphs or local functions (what the exporter writes), :func:`remove_unused` and :func:`toposort` compute the
same result in linear time; any other graph goes to graph-surgeon.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import PassResult
from passes.rewiring import redirect_consumers


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
            redirect_consumers(target, source)
            node.outputs.clear()
            removed += 1
        if removed:
            remove_unused(graph)
        return PassResult(graph, removed > 0, settled=True)  # what is left has no Identity this pass removes


class RemoveDeadNodes:
    """Remove nodes and tensors that no graph output depends on. Unused graph inputs are kept: callers feed them."""

    name = "remove_dead_nodes"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        before = len(graph.nodes)
        remove_unused(graph)
        return PassResult(graph, len(graph.nodes) != before, settled=True)


class TopologicalSort:
    """Order nodes so every producer comes before its consumers (ONNX requires it; passes may break it).

    Nodes end up ordered by depth, as graph-surgeon's ``toposort`` orders them. Only a graph that was out of order
    counts as modified: reordering a graph that already was topologically sorted changes nothing another pass
    could act on, so the pass manager does not run the whole list again for it.
    """

    name = "toposort"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        was_sorted = is_sorted(graph)
        before = [id(n) for n in graph.nodes]
        toposort(graph)
        return PassResult(graph, not was_sorted and [id(n) for n in graph.nodes] != before, settled=True)


def is_flat(graph: gs.Graph) -> bool:
    """No local functions and no node with a subgraph (If, Loop, Scan): the graphs the linear-time versions take."""
    if graph.functions:
        return False
    for node in graph.nodes:
        for value in node.attrs.values():
            if isinstance(value, gs.Graph):
                return False
    return True


def is_sorted(graph: gs.Graph) -> bool:
    """Every node comes after the producers of its inputs."""
    seen: set[int] = set()
    for node in graph.nodes:
        for tensor in node.inputs:
            for producer in tensor.inputs:
                if id(producer) not in seen:
                    return False
        seen.add(id(node))
    return True


def remove_unused(graph: gs.Graph) -> gs.Graph:
    """``graph.cleanup(remove_unused_graph_inputs=False)``, in linear time for a flat graph (see the module doc).

    Same walk from the graph outputs (each tensor name followed once), same nodes kept in the same order, dead nodes
    detached from their tensors. (graph-surgeon follows only names local to the graph; a name no node, input or
    constant has has no producer in the graph to follow, and a producer outside it sends the graph to
    graph-surgeon.)
    """
    if not is_flat(graph):
        return graph.cleanup(remove_unused_graph_inputs=False)
    for tensor in graph.inputs:
        tensor.inputs.clear()
    nodes = graph.nodes
    index = {id(node): i for i, node in enumerate(nodes)}
    used = bytearray(len(nodes))
    seen: set[str] = set()
    queue: list[gs.Tensor] = []
    _enqueue(graph.outputs, seen, queue)
    for tensor in queue:  # the queue grows while it is walked
        for producer in tensor.inputs:
            i = index.get(id(producer))
            if i is None:  # a node missing from graph.nodes: graph-surgeon's error says so
                return graph.cleanup(remove_unused_graph_inputs=False)
            if not used[i]:  # (met again: its inputs are queued already)
                used[i] = 1
                _enqueue(producer.inputs, seen, queue)
    if len(index) == len(nodes):
        flags: Iterable[int] = used
    else:  # a node listed twice is kept, or not, at every place it is listed
        flags = [used[index[id(node)]] for node in nodes]
    kept: list[gs.Node] = []
    dead: list[gs.Node] = []
    for node, flag in zip(nodes, flags, strict=True):
        (kept if flag else dead).append(node)
    if dead:
        detach(dead)
    graph.inputs = list(graph.inputs)
    graph.nodes = kept
    return graph


def _enqueue(tensors: Iterable[gs.Tensor], seen: set[str], queue: list[gs.Tensor]) -> None:
    """Queue the tensors whose name has not been seen (an unnamed one always)."""
    for tensor in tensors:
        name = tensor.name
        if name:
            if name in seen:
                continue
            seen.add(name)
        queue.append(tensor)


def detach(nodes: Iterable[gs.Node]) -> None:
    """``node.inputs.clear(); node.outputs.clear()`` for every node, with each tensor's lists filtered once."""
    dead = {id(node): node for node in nodes}
    consumed: dict[int, gs.Tensor] = {}
    produced: dict[int, gs.Tensor] = {}
    for node in dead.values():
        for tensor in node.inputs:
            consumed[id(tensor)] = tensor
        for tensor in node.outputs:
            produced[id(tensor)] = tensor
    # The raw list methods bypass graph-surgeon's synchronisation: both sides are updated here.
    for tensor in consumed.values():
        list.__setitem__(tensor.outputs, slice(None), [n for n in tensor.outputs if id(n) not in dead])
    for tensor in produced.values():
        list.__setitem__(tensor.inputs, slice(None), [n for n in tensor.inputs if id(n) not in dead])
    for node in dead.values():
        list.clear(node.inputs)
        list.clear(node.outputs)


def toposort(graph: gs.Graph) -> gs.Graph:
    """``graph.toposort()``, in linear time for a flat graph: nodes by depth (1 + the deepest producer), ties in
    the order graph-surgeon's depth-first walk first finishes them."""
    if not is_flat(graph):
        return graph.toposort()
    nodes = graph.nodes
    index = {id(node): i for i, node in enumerate(nodes)}
    empty_is_local = any(not t.name for t in graph.inputs)
    depth: dict[int, int] = {}  # node index -> depth; insertion order is the order the walk finishes nodes
    for root in range(len(nodes)):
        if root in depth:
            continue
        stack = [(root, iter(_producers(nodes[root], index, empty_is_local)), -1)]
        on_stack = {root}
        while stack:
            current, producers, deepest = stack[-1]
            for producer in producers:
                if producer is None or producer in on_stack:  # unknown node or cycle: graph-surgeon reports it
                    return graph.toposort()
                if producer in depth:
                    deepest = max(deepest, depth[producer])
                else:
                    stack[-1] = (current, producers, deepest)
                    stack.append((producer, iter(_producers(nodes[producer], index, empty_is_local)), -1))
                    on_stack.add(producer)
                    break
            else:
                stack.pop()
                on_stack.discard(current)
                depth[current] = deepest + 1
                if stack:
                    parent, rest, parent_deepest = stack[-1]
                    stack[-1] = (parent, rest, max(parent_deepest, deepest + 1))
    graph.nodes = [nodes[i] for i in sorted(depth, key=depth.__getitem__)]
    graph.functions = []
    return graph


def _producers(node: gs.Node, index: dict[int, int], empty_is_local: bool) -> list[int | None]:
    """Indices of the nodes producing ``node``'s inputs, first occurrence first (None: a node not in the graph).

    graph-surgeon looks only at inputs whose name is local to the graph; a name that is not has no producer in
    the graph, and one outside it sends the graph to graph-surgeon anyway.
    """
    found: dict[int | None, None] = {}
    for tensor in node.inputs:
        if tensor.name or empty_is_local:
            for producer in tensor.inputs:
                found[index.get(id(producer))] = None
    return list(found)
