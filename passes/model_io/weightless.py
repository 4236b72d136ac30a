"""A model's large inline weights held apart from its graph: a light proto plus the weights as arrays.

Serialising a ModelProto copies every weight (0.4 s for a 216 MB Llama step, and as long again for the reader to
parse them back), and the pipeline hands the same graph to several readers. Those that read no weight value, or
take the weights another way, get the light proto instead: each initializer of at least ``min_bytes`` keeps its
name, type and dimensions, and is marked as external data at the location :data:`IN_MEMORY`, which names no file.

- ONNX shape inference reads no external data: it infers the light graph.
- ONNX Runtime takes the arrays with ``SessionOptions.add_external_initializers`` and, without prepacking, reads
  them in place: the weights are copied once out of the proto and never serialised or parsed.

A model that already keeps weights in external files is left as it is (it is light already).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from passes.model_io.external_data import IN_MEMORY, has_external_data

#: Initializers of at least this many bytes are held apart (onnx.save's own threshold for external data).
MIN_BYTES = 1024
#: The ONNX element types held apart: those numpy has a native type for (ONNX Runtime takes them from numpy).
_NUMPY_TYPES: dict[int, type] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.DOUBLE: np.float64,
    TensorProto.INT8: np.int8,
    TensorProto.UINT8: np.uint8,
    TensorProto.INT16: np.int16,
    TensorProto.UINT16: np.uint16,
    TensorProto.INT32: np.int32,
    TensorProto.UINT32: np.uint32,
    TensorProto.INT64: np.int64,
    TensorProto.UINT64: np.uint64,
    TensorProto.BOOL: np.bool_,
}


def weightless(model: onnx.ModelProto, min_bytes: int = MIN_BYTES) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``(light, weights)``: a copy of ``model`` whose top-level initializers of at least ``min_bytes`` (stored as
    ``raw_data`` of a numpy type) are external at :data:`IN_MEMORY`, and their values by name (read-only arrays).
    ``model`` itself, and no weights, when nothing is held apart or its weights are in files already."""
    weights: dict[str, np.ndarray] = {}
    return _light(model, min_bytes, weights), weights


def light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose large weights are headers only (as :func:`weightless` makes, their values not read):
    for readers of the graph and its types alone, such as ONNX shape inference. ``model`` itself when it is light."""
    return _light(model, MIN_BYTES, None)


def serialized_size(model: onnx.ModelProto) -> int:
    """About the bytes ``model`` serialises to (at most 64 bytes over per large weight), without serialising its weights
    (upb's ``ByteSize`` serialises the whole message: 0.4 s for 216 MB)."""
    light = _light(model, MIN_BYTES, None)
    held = {t.name for t in light.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    return light.ByteSize() + sum(_size(t) for t in model.graph.initializer if t.name in held)


def _light(model: onnx.ModelProto, min_bytes: int, weights: dict[str, np.ndarray] | None) -> onnx.ModelProto:
    """The light copy of ``model``; with ``weights``, the values held apart are read into it (else not read)."""
    graph = model.graph
    movable = [_movable(t, min_bytes) for t in graph.initializer]
    if not any(movable) or has_external_data(model):
        return model
    light = onnx.ModelProto()
    copy_fields(model, light, skip=("graph",))
    copy_fields(graph, light.graph, skip=("initializer",))
    for tensor, move in zip(graph.initializer, movable, strict=True):
        if move and weights is not None:
            data = tensor.raw_data  # one copy of the bytes, which the array then reads
            move = len(data) == _size(tensor)  # else malformed: left for the reader to refuse
            if move:
                array: np.ndarray = np.frombuffer(data, dtype=_NUMPY_TYPES[tensor.data_type])
                weights[tensor.name] = array.reshape(tuple(tensor.dims))
        if not move:
            light.graph.initializer.append(tensor)
            continue
        header = light.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
        header.data_location = TensorProto.EXTERNAL
        for key, value in (("location", IN_MEMORY), ("offset", "0"), ("length", str(_size(tensor)))):
            header.external_data.add(key=key, value=value)
    return light


def _movable(tensor: onnx.TensorProto, min_bytes: int) -> bool:
    """A top-level tensor of a numpy type stored as ``raw_data``, of at least ``min_bytes``."""
    if tensor.data_type not in _NUMPY_TYPES or tensor.data_location == TensorProto.EXTERNAL:
        return False
    return tensor.HasField("raw_data") and _size(tensor) >= min_bytes


def _size(tensor: onnx.TensorProto) -> int:
    return math.prod(tensor.dims) * np.dtype(_NUMPY_TYPES[tensor.data_type]).itemsize


def copy_fields(source: Any, target: Any, skip: tuple[str, ...]) -> None:
    """Every set field of ``source`` but those named in ``skip`` copied into ``target`` (a message of the same type):
    a copy of a model or graph without the fields the caller fills itself (no copy of weights it replaces)."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        if repeated(field):
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def repeated(field: Any) -> bool:
    """Is the field repeated? protobuf 7 has no ``FieldDescriptor.label``; before 5.28 there is no ``is_repeated``."""
    repeated = getattr(field, "is_repeated", None)
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED
