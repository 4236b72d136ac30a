"""Merged projections split back for ONNX Runtime's prepacked CPU session of a generation step.

``passes/sibling_matmuls.py`` merges MatMuls that share their input (q/k/v, gate/up) into one MatMul and a ``Split``:
one GEMM launch instead of three on TensorRT. On ONNX Runtime's CPU provider the prepacked float32 GEMM runs the
parts faster apart than merged (the issue-35 Llama, one thread, same run: a batch-4 decode step 20.1 against 23.5 ms,
a batch-1 step 16.9 against 19.5 ms, a 128-token prompt 349 against 399 ms at batch 4), while the unprepacked
single-row session (:meth:`pipeline.runtime.ort.executor.OnnxRuntimeExecutor.row_session`) is faster merged (13.8
against 15.9 ms). :func:`split_projections` gives the prepacked session its graph: each ``MatMul`` over a constant
float32 2-D weight whose only reader is a ``Split`` of its last axis with constant sizes becomes one ``MatMul`` per
part, over the matching columns of the weight, writing the ``Split``'s outputs. The numbers are the same products;
``module.onnx`` keeps the merged form.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.external_data_helper import ExternalDataInfo

from passes.model_io.external_data import weights_dir
from passes.model_io.weightless import copy_fields
from pipeline.runtime.ort.graph_index import graph_index

_PREFIX = "ort_split_projection"


def split_projections(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with its merged projections apart (see the module docstring); ``model`` itself when it
    has none. Only the merged weights are read (from the weights directory when they are external), and a model with
    a weights directory (a loaded artifact) gets the parts in a new file there, not inline."""
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    readers = graph_index(graph)
    found: list[tuple[onnx.NodeProto, onnx.NodeProto, list[int]]] = []
    position = {id(n): i for i, n in enumerate(graph.node)}
    for node in graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        weight = initializers.get(node.input[1])
        split = readers.only_reader(node.output[0], "Split")
        if weight is None or split is None or weight.data_type != TensorProto.FLOAT or len(weight.dims) != 2:
            continue
        sizes = _sizes(split, initializers, int(weight.dims[1]))
        if sizes is not None:
            found.append((node, split, sizes))
    if not found:
        return model
    out = onnx.ModelProto()  # the graph's nodes and initializers are filled below: the weights are copied once
    copy_fields(model, out, skip=("graph",))
    copy_fields(graph, out.graph, skip=("node", "initializer"))
    directory = weights_dir(model)
    sink = _PartsFile(directory) if directory is not None else None
    replaced: dict[int, list[onnx.NodeProto]] = {}  # the Split's position -> its MatMuls
    dropped: set[int] = set()  # the merged MatMuls' positions
    parts: list[onnx.TensorProto] = []
    for index, (matmul, split, sizes) in enumerate(found):
        weight = _array(initializers[matmul.input[1]], directory)
        start = 0
        nodes = []
        for part, (size, name) in enumerate(zip(sizes, split.output, strict=True)):
            base = f"{_PREFIX}{index}/{part}"
            values = np.ascontiguousarray(weight[:, start : start + size])
            parts.append(
                sink.tensor(values, f"{base}/w") if sink is not None else numpy_helper.from_array(values, f"{base}/w")
            )
            nodes.append(onnx.helper.make_node("MatMul", [matmul.input[0], f"{base}/w"], [name], name=base))
            start += size
        replaced[position[id(split)]] = nodes
        dropped.add(position[id(matmul)])
    if sink is not None:
        sink.close()
    kept = []
    for i, node in enumerate(graph.node):
        if i not in dropped:
            kept.extend(replaced.get(i, [node]))
    out.graph.node.extend(kept)
    unused = {matmul.input[1] for matmul, _, _ in found} - {n for node in kept for n in node.input}
    out.graph.initializer.extend([*(i for i in graph.initializer if i.name not in unused), *parts])
    return out


class _PartsFile:
    """The parts of a loaded module's merged weights in a new file of its private weights directory (external data
    beside the artifact's: the session reads them from there; serialising them inline cost 0.2 s per load of a
    226 MB Llama). The directory goes with the module."""

    def __init__(self, directory: Path) -> None:
        handle, name = tempfile.mkstemp(prefix="ort_split_projections.", suffix=".bin", dir=directory)
        self.file = os.fdopen(handle, "wb")
        self.name = os.path.basename(name)
        self.offset = 0

    def tensor(self, values: np.ndarray, name: str) -> onnx.TensorProto:
        """``values`` appended to the file (at a 64-byte boundary), as an external initializer named ``name``."""
        padding = -self.offset % 64
        self.file.write(b"\0" * padding)
        self.offset += padding
        values.astype("<f4", copy=False).tofile(self.file)
        length = values.size * 4
        tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=values.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.name), ("offset", str(self.offset)), ("length", str(length))):
            tensor.external_data.add(key=key, value=value)
        self.offset += length
        return tensor

    def close(self) -> None:
        self.file.close()


def _sizes(split: onnx.NodeProto, initializers: dict[str, onnx.TensorProto], width: int) -> list[int] | None:
    """The part widths of a ``Split`` of the last axis (of a 2-D weight's product) with constant sizes."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in split.attribute}
    if attrs.get("axis", 0) != -1 or len(split.input) < 2 or split.input[1] not in initializers:
        return None
    sizes = [int(s) for s in numpy_helper.to_array(initializers[split.input[1]]).reshape(-1)]
    if len(sizes) != len(split.output) or sum(sizes) != width or any(s <= 0 for s in sizes):
        return None
    return sizes


def _array(tensor: onnx.TensorProto, directory: Path | None) -> np.ndarray:
    """The values of a float32 initializer, inline or in the weights directory."""
    if tensor.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    if directory is None:
        raise ValueError(f"initializer {tensor.name!r} is external but the model names no weights directory")
    info = ExternalDataInfo(tensor)
    count = int(np.prod(tensor.dims))
    values = np.memmap(directory / info.location, dtype="<f4", mode="r", offset=int(info.offset or 0), shape=(count,))
    return values.reshape(tuple(tensor.dims))  # read where sliced: the parts are copied once, from the page cache
