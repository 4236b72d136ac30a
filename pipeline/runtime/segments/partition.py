"""Partition the final graph into TensorRT and ONNX Runtime segments, without cycles between them.

Nodes the parser rejects (and ``fallback_ops``) are labelled ONNX Runtime, every other node TensorRT. The segments
are the maximal runs of one label in a topological order chosen to keep each label together as long as it can
(Kahn's algorithm that takes a ready node of the current label before switching, as ONNX Runtime's TensorRT
execution provider grows its subgraphs). Because every segment is a contiguous run of one topological order, a
segment only reads values of the graph inputs and of earlier segments: no TensorRT segment can depend on an ONNX
Runtime segment that depends on it. TensorRT segments with fewer than ``min_segment_size`` compute nodes go back to
ONNX Runtime (Torch-TensorRT's ``min_block_size``) and the runs are formed again.

Partitioning works on the top-level nodes: an ``If``, ``Loop`` or ``Scan`` is one node with its subgraphs whole, and
the outer values its subgraphs read count as its inputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import onnx

TENSORRT_SEGMENT, ORT_SEGMENT = "tensorrt", "onnxruntime"
#: Nodes that do no work of their own: they do not count towards ``min_segment_size``.
_TRIVIAL_OPS = frozenset({"Constant", "Identity", "Cast", "Shape", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})


@dataclass(frozen=True)
class Segment:
    """One segment: which runtime runs it, its top-level node indices (in graph order), and the values it takes from
    the graph inputs or earlier segments and hands to later segments or the graph outputs."""

    kind: str
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def used_values(node: onnx.NodeProto) -> list[str]:
    """Every value ``node`` reads: its inputs, and the outer values its subgraphs (If/Loop/Scan bodies) read."""
    used = [name for name in node.input if name]
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.HasField("g") else list(attribute.graphs)
        for graph in graphs:
            used += [name for name in _outer_values(graph) if name not in used]
    return used


def _outer_values(graph: onnx.GraphProto) -> list[str]:
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    outer: list[str] = []
    for node in graph.node:
        outer += [name for name in used_values(node) if name not in defined and name not in outer]
        defined.update(node.output)
    return outer


def top_level_names(graph: onnx.GraphProto) -> dict[str, int]:
    """Node name -> index of the top-level node it is or sits inside (subgraph nodes map to their If/Loop)."""
    names: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in _names_within(node):
            names.setdefault(name, index)
    for index, node in enumerate(graph.node):  # a top-level name wins over a nested node of the same name
        if node.name:
            names[node.name] = index
    return names


def _names_within(node: onnx.NodeProto) -> Iterable[str]:
    if node.name:
        yield node.name
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
            for inner in graph.node:
                yield from _names_within(inner)


def compute_nodes(model: onnx.ModelProto, indices: Iterable[int]) -> int:
    """How many of the nodes do work (``min_segment_size`` counts these)."""
    return sum(model.graph.node[i].op_type not in _TRIVIAL_OPS for i in indices)


def partition(model: onnx.ModelProto, excluded: Iterable[int], min_segment_size: int = 1) -> tuple[Segment, ...]:
    """The segments of ``model``'s top-level graph with the nodes ``excluded`` (indices) on ONNX Runtime.

    >>> [s.kind for s in partition(model, excluded=[3], min_segment_size=1)]   # doctest: +SKIP
    ['tensorrt', 'onnxruntime', 'tensorrt']
    """
    graph = model.graph
    producers = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    deps = [{producers[v] for v in used_values(node) if v in producers} for node in graph.node]
    on_ort = set(excluded)
    while True:
        runs = _runs(deps, on_ort)
        small = [run for kind, run in runs if kind == TENSORRT_SEGMENT and compute_nodes(model, run) < min_segment_size]
        if not small:
            break
        on_ort.update(i for run in small for i in run)
    return tuple(_segment(model, kind, run, runs, producers) for kind, run in runs)


def _runs(deps: Sequence[set[int]], on_ort: set[int]) -> list[tuple[str, list[int]]]:
    """Maximal runs of one label in a topological order that stays on a label while it has ready nodes."""
    count = len(deps)
    users: list[list[int]] = [[] for _ in range(count)]
    waiting = [len(d) for d in deps]
    for node, dep in enumerate(deps):
        for d in dep:
            users[d].append(node)
    ready: dict[str, list[int]] = {TENSORRT_SEGMENT: [], ORT_SEGMENT: []}
    label = [ORT_SEGMENT if i in on_ort else TENSORRT_SEGMENT for i in range(count)]
    for node in range(count):
        if not waiting[node]:
            heapq.heappush(ready[label[node]], node)
    runs: list[tuple[str, list[int]]] = []
    current = ""
    while ready[TENSORRT_SEGMENT] or ready[ORT_SEGMENT]:
        if not current or not ready[current]:
            # switch to the label whose next node comes first in graph order
            current = min((k for k in ready if ready[k]), key=lambda k: ready[k][0])
            runs.append((current, []))
        node = heapq.heappop(ready[current])
        runs[-1][1].append(node)
        for user in users[node]:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready[label[user]], user)
    return [(kind, sorted(run)) for kind, run in runs]


def _segment(
    model: onnx.ModelProto,
    kind: str,
    run: list[int],
    runs: list[tuple[str, list[int]]],
    producers: Mapping[str, int],
) -> Segment:
    graph = model.graph
    inside = set(run)
    initializers = {t.name for t in graph.initializer}
    inputs: list[str] = []
    for i in run:
        for name in used_values(graph.node[i]):
            if name not in initializers and producers.get(name) not in inside and name not in inputs:
                inputs.append(name)
    read_later = {name for _, other in runs if other is not run for i in other for name in used_values(graph.node[i])}
    read_later |= {o.name for o in graph.output}
    outputs = [out for i in run for out in graph.node[i].output if out and out in read_later]
    return Segment(kind, tuple(run), tuple(inputs), tuple(dict.fromkeys(outputs)))


def segment_model(
    model: onnx.ModelProto, segment: Segment, values: Mapping[str, onnx.ValueInfoProto]
) -> onnx.ModelProto:
    """The segment as a model of its own: its nodes, the initializers they read, ``values`` (name -> value info) for
    its inputs and outputs, and the model's opsets, functions and metadata (external weights stay where they are)."""
    graph = model.graph
    nodes = [graph.node[i] for i in segment.nodes]
    read = {name for node in nodes for name in used_values(node)}
    initializers = [t for t in graph.initializer if t.name in read]
    sub = onnx.helper.make_graph(
        nodes,
        f"{graph.name or 'graph'}_{segment.kind}_{segment.nodes[0]}",
        [values[name] for name in segment.inputs],
        [values[name] for name in segment.outputs],
        initializers,
    )
    result = onnx.helper.make_model(
        sub, opset_imports=list(model.opset_import), ir_version=model.ir_version, functions=list(model.functions)
    )
    result.metadata_props.extend(model.metadata_props)  # the weights directory of external initializers
    return result
