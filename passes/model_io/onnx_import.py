"""``gs.import_onnx`` in less than half the time: the same graph, built without graph-surgeon's per-attribute hooks.

graph-surgeon builds every tensor and node through ``__setattr__`` overrides and its synchronised lists through a
Python-level ``extend``, and reads each tensor's type through helpers that rebuild a list of ONNX types on every
call; on an exporter's graph (value info for every tensor) that is most of the import. :func:`import_onnx` makes the
objects graph-surgeon 0.6.1 makes, with the same attributes set to the same values in the same order, and the
same graph around them: same tensors (Constant with ``LazyValues`` for initializers, Variable with dtype, shape and
type from value info, inputs and outputs), same nodes in the same order with the same attributes, same sharing of
tensor objects, same producers and consumers. ``tests/passes/test_onnx_import.py`` compares the two field by
field.

What it relies on in graph-surgeon 0.6.1 (other versions, and models with local functions, go to
``gs.import_onnx``):

- ``Variable.__init__`` sets ``name``, ``inputs``, ``outputs``, ``dtype``, ``shape``, ``type``; ``Constant.__init__``
  sets ``name``, ``inputs``, ``outputs``, ``_values``, ``data_location``, ``_export_dtype``; ``Node.__init__`` sets
  ``op``, ``name``, ``attrs``, ``inputs``, ``outputs``, ``domain``. Their ``__setattr__`` only special-cases
  ``inputs`` and ``outputs`` (assigning into an existing list), which we set once, on a fresh object.
- ``SynchronizedList(parent, field_name, initial)`` sets ``parent_obj`` and ``field_name`` and appends ``parent``
  to ``getattr(item, field_name)`` of every item (with ``list.append``); the ``inputs`` list of a node or a tensor
  has field ``outputs``, its ``outputs`` list field ``inputs``.
- ``OnnxImporter.import_graph``'s order: initializers, sparse initializers, value info (filling the dtype and shape
  of a known Variable), graph inputs that are not initializers, graph outputs, then the nodes: attributes
  (``OnnxImporter.import_attributes``, called as it calls it), inputs, outputs; a name seen for the first time
  makes a Variable, an empty name a new unnamed Variable each time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.importers.onnx_importer import (
    OnnxImporter,
    get_onnx_tensor_dtype,
    get_onnx_tensor_shape,
    get_onnx_tensor_type,
)
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.util.misc import SynchronizedList

#: graph-surgeon versions whose objects :func:`import_onnx` is known to build exactly.
VERIFIED_GS_VERSIONS = ("0.6.1",)

_set = object.__setattr__  # the plain attribute write that graph-surgeon's __setattr__ ends in
_Type = tuple[Any, list[Any] | None, str] | None  # dtype, shape and kind of a value info's type; None: no type


def import_onnx(model: onnx.ModelProto) -> gs.Graph:
    """``gs.import_onnx(model)``, faster (see the module doc).

    >>> graph = import_onnx(onnx.load("model.onnx"))  # doctest: +SKIP
    """
    if gs.__version__ not in VERIFIED_GS_VERSIONS or len(model.functions):
        return gs.import_onnx(model)
    opset = OnnxImporter.get_opset(model)
    domains = OnnxImporter.get_import_domains(model)
    proto = model.graph
    tensors: dict[str, gs.Tensor] = {}
    for initializer in proto.initializer:
        if initializer.name not in tensors:
            location = int(initializer.data_location) if initializer.HasField("data_location") else None
            tensors[initializer.name] = _constant(initializer.name, LazyValues(initializer), location)
    for sparse in proto.sparse_initializer:
        if sparse.values.name not in tensors:
            tensors[sparse.values.name] = OnnxImporter.import_tensor(sparse)
    types: dict[bytes, _Type] = {}  # value info of one type (serialised) gives one dtype, shape and kind
    for info in proto.value_info:
        known = tensors.get(info.name)
        if known is None:
            tensors[info.name] = _variable_from(info, types)
        elif isinstance(known, gs.Variable):  # graph-surgeon's overwrite: what the value info adds
            new = _variable_from(info, types)
            known.dtype = known.dtype or new.dtype
            known.shape = known.shape or new.shape
    initializer_names = {t.name for t in proto.initializer} | {t.values.name for t in proto.sparse_initializer}
    inputs = [_tensor_from(info, tensors, types) for info in proto.input if info.name not in initializer_names]
    outputs = [_tensor_from(info, tensors, types) for info in proto.output]
    outer: OrderedDict[str, gs.Tensor] = OrderedDict()  # import_graph's tensor map of the outer graph: none here
    nodes = []
    subgraphs = False
    for node_proto in proto.node:
        attrs: OrderedDict[str, Any] = OrderedDict()
        if len(node_proto.attribute):
            attrs = OnnxImporter.import_attributes(node_proto.attribute, outer, tensors, opset, domains)
            subgraphs = subgraphs or any(isinstance(value, gs.Graph) for value in attrs.values())
        node = object.__new__(gs.Node)
        _set(node, "op", node_proto.op_type)
        _set(node, "name", node_proto.name)
        _set(node, "attrs", attrs)
        _set(node, "inputs", _synced(node, "outputs", _named(node_proto.input, tensors)))
        _set(node, "outputs", _synced(node, "inputs", _named(node_proto.output, tensors)))
        _set(node, "domain", node_proto.domain if node_proto.HasField("domain") else None)
        nodes.append(node)
    graph = gs.Graph(
        nodes=nodes if subgraphs else [],  # Graph() walks the nodes for subgraphs, to share its function list
        inputs=inputs,
        outputs=outputs,
        name=proto.name,
        doc_string=proto.doc_string,
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        opset=opset,
        import_domains=domains,
        functions=[],
        ir_version=model.ir_version,
    )
    graph.nodes = nodes
    return graph


def _named(names: Iterable[str], tensors: dict[str, gs.Tensor]) -> list[gs.Tensor]:
    """The tensors a node reads or writes, made on first sight; an omitted one ('') is a new unnamed Variable."""
    found = []
    for name in names:
        tensor = tensors.get(name)
        if tensor is None:
            tensor = _variable(name)
            if name:
                tensors[name] = tensor
        found.append(tensor)
    return found


def _synced(parent: object, field_name: str, items: list[gs.Tensor] | list[gs.Node]) -> SynchronizedList:
    """``SynchronizedList(parent, field_name, items)``."""
    synced = SynchronizedList.__new__(SynchronizedList)
    synced.parent_obj = parent
    synced.field_name = field_name
    if items:
        list.extend(synced, items)
        for item in items:
            list.append(getattr(item, field_name), parent)
    return synced


def _variable(name: str, dtype: Any = None, shape: list[Any] | None = None, type: str = "tensor_type") -> gs.Variable:
    """``gs.Variable(name, dtype, shape, type)``."""
    tensor = object.__new__(gs.Variable)
    _set(tensor, "name", name)
    _set(tensor, "inputs", _synced(tensor, "outputs", []))
    _set(tensor, "outputs", _synced(tensor, "inputs", []))
    _set(tensor, "dtype", dtype)
    _set(tensor, "shape", shape)
    _set(tensor, "type", type)
    return tensor


def _constant(name: str, values: LazyValues, data_location: int | None) -> gs.Constant:
    """``gs.Constant(name, values, data_location)``."""
    tensor = object.__new__(gs.Constant)
    _set(tensor, "name", name)
    _set(tensor, "inputs", _synced(tensor, "outputs", []))
    _set(tensor, "outputs", _synced(tensor, "inputs", []))
    _set(tensor, "_values", values)
    _set(tensor, "data_location", data_location)
    _set(tensor, "_export_dtype", None)
    return tensor


def _tensor_from(info: onnx.ValueInfoProto, tensors: dict[str, gs.Tensor], types: dict[bytes, _Type]) -> gs.Tensor:
    known = tensors.get(info.name)
    if known is None:
        known = tensors[info.name] = _variable_from(info, types)
    return known


def _variable_from(info: onnx.ValueInfoProto, types: dict[bytes, _Type]) -> gs.Variable:
    """``OnnxImporter.import_tensor(info)`` for a value info, its type read by graph-surgeon once per distinct type
    (serialising a type costs an eighth of reading its dims through protobuf's Python API)."""
    key = info.type.SerializeToString()
    if key not in types:
        types[key] = (
            (get_onnx_tensor_dtype(info), get_onnx_tensor_shape(info), get_onnx_tensor_type(info))
            if info.type.ByteSize() > 0
            else None
        )
    known = types[key]
    if known is None:
        return _variable(info.name)
    dtype, shape, kind = known
    return _variable(info.name, dtype, None if shape is None else list(shape), kind)
