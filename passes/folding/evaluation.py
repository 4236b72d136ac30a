"""Evaluating the foldable nodes of a graph on ONNX Runtime, as graph-surgeon's constant folding does, in sessions of
about :data:`SESSION_NODES` nodes.

graph-surgeon evaluates every foldable tensor in one session, with default options; creating a session grows faster
than linearly with the nodes and outputs in it (about 17 s for the 16,000 foldable nodes of an 80,000-node chain,
against 0.5 s for a quarter of them). Here each session holds whole connected pieces of the foldable nodes, so no
value crosses sessions, with the options graph-surgeon uses. When a session fails, or the set is one graph-surgeon's
single session could fail on as a whole, everything runs in one session, as there: a failure means what it means
there, nothing evaluated is folded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, constant_to_onnx_tensor
from onnx_graphsurgeon.ir.tensor import LazyValues, SparseValues

from passes.model_io.external_data import (  # read into the fold session: it has no weights directory
    PROTOBUF_LIMIT,
    ExternalValues,
)
from passes.model_io.onnx_export import TensorTypes, copy_messages, onnx_type, tensor_type, write_node

logger = logging.getLogger(__name__)

#: Foldable nodes per ONNX Runtime session: small enough that session creation stays linear, large enough that its
#: fixed cost does not matter.
SESSION_NODES = 1024

_ORT_PROVIDERS = ["CPUExecutionProvider"]


def evaluate(
    graph: gs.Graph, nodes: list[gs.Node], outputs: list[gs.Tensor], folded: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """The values of ``outputs``, computed on ONNX Runtime in sessions of whole connected pieces; {} when that
    fails. A failing piece, or a set that graph-surgeon's single session could fail on as a whole (two nodes of
    one name, a model over protobuf's 2 GB), is run in one session, as graph-surgeon runs it."""
    domains = _opset_imports(graph, nodes)
    chunks = _chunks(nodes, outputs, folded) if _splittable(nodes, folded) else [(nodes, outputs)]
    values = _run(graph, chunks, folded, domains)
    if values is None and len(chunks) > 1:
        values = _run(graph, [(nodes, outputs)], folded, domains)
    if values is None:
        logger.warning("constant folding: inference failed; nothing it would have computed is folded")
        return {}
    return {t.name: values[t.name] for t in outputs}


def _run(
    graph: gs.Graph,
    chunks: list[tuple[list[gs.Node], list[gs.Tensor]]],
    folded: Mapping[str, np.ndarray],
    domains: list[onnx.OperatorSetIdProto],
) -> dict[str, Any] | None:
    import onnxruntime as ort

    values: dict[str, Any] = {}
    types: TensorTypes = {}
    try:
        for nodes, outputs in chunks:
            model = _export(graph, nodes, outputs, folded, domains, types)
            session = ort.InferenceSession(model.SerializeToString(), providers=_ORT_PROVIDERS)
            names = [t.name for t in outputs]
            values.update(zip(names, session.run(names, {}), strict=True))
    except Exception as exc:
        logger.info("constant folding: inference failed on %d nodes: %s", sum(len(n) for n, _ in chunks), exc)
        return None
    return values


#: Bytes a model may reach before protobuf refuses to serialise it, less a margin for what we do not count.
_PROTOBUF_LIMIT = PROTOBUF_LIMIT - (64 << 20)  # room for the nodes and types around the constants


def _splittable(nodes: list[gs.Node], folded: Mapping[str, np.ndarray]) -> bool:
    """Whether the sessions of :func:`_chunks` succeed and fail together with one session over all ``nodes``."""
    names = [node.name for node in nodes if node.name]
    if len(names) != len(set(names)):
        return False
    constants: dict[str, int] = {}
    for node in nodes:
        for tensor in node.inputs:
            if tensor.name and tensor.name not in constants and _is_constant(tensor, folded):
                constants[tensor.name] = _nbytes(tensor, folded)
    return sum(constants.values()) + 1024 * len(nodes) < _PROTOBUF_LIMIT


def _nbytes(tensor: gs.Tensor, folded: Mapping[str, np.ndarray]) -> int:
    if tensor.name in folded:
        return int(folded[tensor.name].nbytes)
    return int(tensor._values.nbytes)  # numpy arrays and graph-surgeon's lazy values both know it


def _chunks(
    nodes: list[gs.Node], outputs: list[gs.Tensor], folded: Mapping[str, np.ndarray]
) -> list[tuple[list[gs.Node], list[gs.Tensor]]]:
    """``nodes`` split into groups of whole connected pieces (joined by the tensors they compute, not by shared
    constants) of about SESSION_NODES nodes, each with the ``outputs`` it produces, in graph order."""
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    position = {id(node): i for i, node in enumerate(nodes)}
    for i, node in enumerate(nodes):
        for tensor in node.inputs:
            if tensor.name and not _is_constant(tensor, folded):
                for producer in tensor.inputs:
                    if id(producer) in position:
                        parent[root(i)] = root(position[id(producer)])
    pieces: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        pieces.setdefault(root(i), []).append(i)
    groups: list[list[int]] = [[]]
    for members in pieces.values():  # in the order of each piece's first node
        if groups[-1] and len(groups[-1]) + len(members) > SESSION_NODES:
            groups.append([])
        groups[-1].extend(members)
    group_of = {id(nodes[i]): g for g, members in enumerate(groups) for i in members}
    chunk_outputs: list[list[gs.Tensor]] = [[] for _ in groups]
    for tensor in outputs:
        chunk_outputs[group_of[id(tensor.inputs[0])]].append(tensor)
    return [([nodes[i] for i in sorted(members)], outs) for members, outs in zip(groups, chunk_outputs, strict=True)]


def _export(
    graph: gs.Graph,
    nodes: list[gs.Node],
    outputs: list[gs.Tensor],
    folded: Mapping[str, np.ndarray],
    domains: list[onnx.OperatorSetIdProto],
    types: TensorTypes,
) -> onnx.ModelProto:
    """What graph-surgeon exports of its copy for ``outputs``: the nodes, the constants they read as initializers,
    value_info for the rest, outputs without a type check. Written straight into the model (``make_graph`` and
    ``make_model`` would copy every initializer twice), the types of value info made once per dtype and shape."""
    produced = {t.name for t in outputs}
    used: dict[str, gs.Tensor] = {}
    for node in nodes:
        for tensor in (*node.inputs, *node.outputs):
            if tensor.name:
                used.setdefault(tensor.name, tensor)
    inputs = [t for t in graph.inputs if t.name in used]
    skip = produced | {t.name for t in inputs}  # outputs and inputs have their own value info
    initializers, sparse, value_info = [], [], []
    for name, tensor in used.items():
        if name in folded:
            initializers.append(_array_proto(name, folded[name]))
        elif isinstance(tensor, gs.Constant):
            if isinstance(tensor._values, SparseValues):
                sparse.append(OnnxExporter.export_sparse_tensor_proto(tensor))
            elif isinstance(tensor._values, LazyValues) and not isinstance(tensor._values, ExternalValues):
                initializers.append(OnnxExporter.export_tensor_proto(tensor))
            else:
                initializers.append(constant_to_onnx_tensor(tensor))
        elif name not in skip and (tensor.dtype is not None or tensor.shape is not None):
            value_info.append(_value_info(tensor, types))
    model = onnx.ModelProto()
    model.ir_version = onnx.IR_VERSION  # what make_model writes first
    proto = model.graph
    for node in nodes:
        write_node(node, proto.node.add())
    proto.name = graph.name
    copy_messages(proto.input, [_value_info(t, types) for t in inputs])
    copy_messages(proto.output, [_value_info(t, types) for t in outputs])
    copy_messages(proto.initializer, initializers)
    copy_messages(proto.sparse_initializer, sparse)
    copy_messages(proto.value_info, value_info)
    if graph.doc_string:
        proto.doc_string = graph.doc_string
    model.opset_import.extend(domains)
    model.producer_name = ""
    model.producer_version = ""
    if graph.ir_version is not None:
        model.ir_version = graph.ir_version
    return model


def _array_proto(name: str, values: np.ndarray) -> onnx.TensorProto:
    """``constant_to_onnx_tensor(gs.Constant(name, values))``: the raw bytes, in the array's own type."""
    return onnx.helper.make_tensor(name, onnx_type(values.dtype), values.shape, values.tobytes(), raw=True)


def _value_info(tensor: gs.Tensor, types: TensorTypes) -> onnx.ValueInfoProto | tuple[str, onnx.TypeProto]:
    """graph-surgeon's value info for its copy of a tensor (a copy is always a plain tensor type), as a proto or as
    the (name, type) pair :func:`copy_messages` writes."""
    dtype = tensor.dtype
    if dtype is None:
        return onnx.helper.make_empty_tensor_value_info(tensor.name)
    elem_type = onnx_type(dtype)
    type_proto = tensor_type(elem_type, tensor.shape, types)
    if type_proto is None:
        return onnx.helper.make_tensor_value_info(tensor.name, elem_type, tensor.shape)
    return tensor.name, type_proto


def _opset_imports(graph: gs.Graph, nodes: Sequence[gs.Node]) -> list[onnx.OperatorSetIdProto]:
    """graph-surgeon's ``update_import_domains`` on its copy, whose list of domains is the graph's own (when set):
    the domains of the evaluated nodes are added to the graph's list too."""
    domains = graph.import_domains
    if domains is None:
        domains = [onnx.helper.make_opsetid("", graph.opset)]
    used = {node.domain for node in nodes}  # built as graph-surgeon builds it, so it is visited in the same order
    used.discard(None)
    current = {opset.domain for opset in domains}
    for domain in used:
        if domain not in current:
            domains.append(onnx.helper.make_opsetid(domain, 1))
            current.add(domain)
    return list(domains)


def _is_constant(tensor: gs.Tensor, folded: Mapping[str, np.ndarray]) -> bool:
    return isinstance(tensor, gs.Constant) or tensor.name in folded
