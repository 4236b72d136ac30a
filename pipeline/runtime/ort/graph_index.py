"""Who makes and who reads each named value of an ONNX graph, as the session-graph rewrites of this package look
them up, and the two small node builders they share."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper


@dataclass(frozen=True)
class GraphIndex:
    """The producers and readers of every named value of one graph, its output names and its inputs."""

    producers: dict[str, onnx.NodeProto]
    readers: dict[str, list[onnx.NodeProto]]
    outputs: frozenset[str]
    inputs: dict[str, onnx.ValueInfoProto]
    graph: onnx.GraphProto

    def reader_count(self, name: str) -> int:
        """How many node inputs read ``name`` (a node reading it twice counts twice)."""
        return len(self.readers.get(name, ()))

    def producer(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The node making ``name`` when it is an ``op_type`` of the default domain."""
        node = self.producers.get(name)
        return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None

    def only_reader(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The single node reading ``name`` when it is an ``op_type`` of the default domain (and ``name`` is not a
        graph output)."""
        readers = self.readers.get(name, [])
        if name in self.outputs or len(readers) != 1:
            return None
        node = readers[0]
        return node if node.op_type == op_type and node.domain in ("", "ai.onnx") else None

    @functools.cached_property
    def constants(self) -> dict[str, onnx.TensorProto]:
        """Constant tensors (initializers and default-domain ``Constant`` nodes' values), by name."""
        found: dict[str, onnx.TensorProto] = {i.name: i for i in self.graph.initializer}
        for node in self.graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = next((a for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    found[node.output[0]] = value.t
        return found


def graph_index(graph: onnx.GraphProto) -> GraphIndex:
    """The index of ``graph`` as it is now (a rewrite that changes the graph takes a new one)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return GraphIndex(
        producers={o: n for n in graph.node for o in n.output},
        readers=readers,
        outputs=frozenset(o.name for o in graph.output),
        inputs={i.name: i for i in graph.input},
        graph=graph,
    )


def const(name: str, values: Iterable[int] | np.ndarray, dtype: type = np.int64) -> onnx.NodeProto:
    """A ``Constant`` node named ``name`` (its output too) holding ``values`` as ``dtype``."""
    array: np.ndarray = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=dtype)
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(array, name))


def perm(node: onnx.NodeProto) -> list[int]:
    """A ``Transpose``'s permutation (empty when it has none: the reverse of the axes)."""
    return next((list(helper.get_attribute_value(a)) for a in node.attribute if a.name == "perm"), [])
