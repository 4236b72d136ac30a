"""Merged projections split back for ONNX Runtime's prepacked CPU session of a generation step, over column slices of
the merged weight that the session computes once, when it is made.

``passes/sibling_matmuls.py`` merges MatMuls that share their input (q/k/v, gate/up) into one MatMul and a
``Split``: one GEMM launch instead of three on TensorRT. On ONNX Runtime's CPU provider the prepacked float32 GEMM
runs the parts faster apart than merged (the issue-35 Llama, one thread: a batch-4 decode step 20.1 against 23.5 ms,
a batch-1 step 16.9 against 19.5 ms, a 128-token prompt 349 against 399 ms at batch 4), while the unprepacked
single-row session (:meth:`pipeline.runtime.ort.executor.OnnxRuntimeExecutor.row_session`) is faster merged (13.8
against 15.9 ms). :func:`split_projections` gives the prepacked session its graph: each ``MatMul`` over a constant
float32 2-D weight whose only reader is a ``Split`` of its last axis with constant sizes becomes a ``Split`` of the
weight's columns into the same parts and one ``MatMul`` per part, writing the first ``Split``'s outputs: the split
moves from the product to the weight. That ``Split`` reads only constants: ONNX Runtime's constant folding computes
the parts once while the session is made (one pass over the merged weight: cheaper than a ``Slice`` per part, which
reads it once per part), and prepacks them as it prepacks any weight. The numbers are the same products
(``tests/pipeline/test_load_speed.py``).

Nothing here reads a weight (the parts used to be copied out in Python and written to a file at every load:
0.15-0.35 s of the 226 MB Llama's load, against 0.006 s now): the graph stays light and can be saved in an artifact
beside the graph it was made from (:mod:`pipeline.runtime.ort.stored_graph`). ``module.onnx`` keeps the merged form.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from passes.model_io.weightless import copy_fields
from pipeline.runtime.ort.graph_index import graph_index

_PREFIX = "ort_split_projection"


def split_projections(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose merged projections run apart, over the parts of a ``Split`` of the merged weight
    that ONNX Runtime folds into constants (see the module docstring); ``model`` itself when it has none. No weight is
    read: external initializers stay where they are."""
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    readers = graph_index(graph)
    found: list[tuple[onnx.NodeProto, onnx.NodeProto, list[int]]] = []
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
    out = onnx.ModelProto()  # the graph's nodes are filled below; the initializers are the same tensors
    copy_fields(model, out, skip=("graph",))
    copy_fields(graph, out.graph, skip=("node",))
    replaced: dict[int, list[onnx.NodeProto]] = {}  # id(Split) -> the weight's Split and the parts' MatMuls
    merged = {id(matmul) for matmul, _, _ in found}
    for index, (matmul, split, sizes) in enumerate(found):
        base = f"{_PREFIX}{index}"
        out.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64), f"{base}/sizes"))
        parts = [f"{base}/{part}/w" for part in range(len(sizes))]
        nodes = [helper.make_node("Split", [matmul.input[1], f"{base}/sizes"], parts, name=f"{base}/w", axis=1)]
        for part, (weight, name) in enumerate(zip(parts, split.output, strict=True)):
            nodes.append(helper.make_node("MatMul", [matmul.input[0], weight], [name], name=f"{base}/{part}"))
        replaced[id(split)] = nodes
    for node in graph.node:
        if id(node) not in merged:
            out.graph.node.extend(replaced.get(id(node), [node]))
    return out


def _sizes(split: onnx.NodeProto, initializers: dict[str, onnx.TensorProto], width: int) -> list[int] | None:
    """The part widths of a ``Split`` of the last axis (of a 2-D weight's product) with constant sizes."""
    attrs = {a.name: helper.get_attribute_value(a) for a in split.attribute}
    if attrs.get("axis", 0) != -1 or len(split.input) < 2 or split.input[1] not in initializers:
        return None
    sizes_tensor = initializers[split.input[1]]
    if sizes_tensor.data_location == TensorProto.EXTERNAL:
        return None  # a few int64s are inline; one that is not is no split this rewrite knows
    sizes = [int(s) for s in numpy_helper.to_array(sizes_tensor).reshape(-1)]
    if len(sizes) != len(split.output) or sum(sizes) != width or any(s <= 0 for s in sizes):
        return None
    return sizes
