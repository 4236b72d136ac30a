"""A residual ``Add`` and the ``RMSNormalization`` of its sum as ONNX Runtime's one CPU kernel,
``com.microsoft::SkipSimplifiedLayerNormalization``.

A decoder layer adds each block's output to the residual stream and normalises the sum for the next block: two nodes,
two passes over the hidden state, and (on a decode step, where each node costs more to launch than to run) two
kernel launches. ONNX Runtime's fused kernel returns the normalised sum and, as its fourth output, the sum itself,
which the next residual ``Add`` reads. :func:`skip_norm_graph` makes that replacement where it is exact: a
float32 ``Add`` of two tensors of one shape [batch, steps, hidden] (both recorded, the same dimensions), read by an
``RMSNormalization`` over the last axis with a constant 1-D scale and float32 statistics. Everything else stays.
The session's graph only (:func:`pipeline.runtime.ort.session_graph.runnable_model`): ``module.onnx`` stays
standard ONNX.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from pipeline.runtime.ort.graph_index import graph_index
from pipeline.runtime.ort.recorded_types import Dim, recorded_types

_PREFIX = "ort_skip_norm"


def skip_norm_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each residual ``Add`` + ``RMSNormalization`` pair as one ``SkipSimplifiedLayerNormalization``
    (see the module docstring); ``model`` itself when none matches. Modifies ``model``'s graph in place when it
    does (the caller passes its own copy)."""
    graph = model.graph
    index = graph_index(graph)
    shapes = recorded_types(model)
    initializers = {i.name: i for i in graph.initializer}
    fused: dict[int, onnx.NodeProto] = {}  # id(RMSNormalization) -> its replacement
    adds: set[int] = set()
    for node in graph.node:
        if node.op_type != "RMSNormalization" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        add = index.producer(node.input[0], "Add")
        if add is None or id(add) in adds:
            continue
        epsilon = _exact_norm(node, shapes, initializers)
        if epsilon is None or not _residual(add, shapes):
            continue
        total = add.output[0]
        keep_sum = index.reader_count(total) > 1 or total in index.outputs
        fused[id(node)] = helper.make_node(
            "SkipSimplifiedLayerNormalization",
            [add.input[0], add.input[1], node.input[1]],
            [node.output[0], "", "", total] if keep_sum else [node.output[0]],
            name=f"{_PREFIX}/{node.name or node.output[0]}",
            domain="com.microsoft",
            epsilon=epsilon,
        )
        adds.add(id(add))
    if not fused:
        return model
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in adds]
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _residual(add: onnx.NodeProto, shapes: dict[str, tuple[int, list[Dim]]]) -> bool:
    """A float32 sum of two [batch, steps, hidden] tensors of the same recorded dimensions (no broadcasting)."""
    known = [shapes.get(name) for name in (*add.input, add.output[0])]
    if any(k is None for k in known):
        return False
    types = {k[0] for k in known if k is not None}
    dims = [k[1] for k in known if k is not None]
    return (
        types == {TensorProto.FLOAT}
        and len(dims[0]) == 3
        and all(d is not None for d in dims[0])
        and dims[0] == dims[1] == dims[2]
        and isinstance(dims[0][2], int)
    )


def _exact_norm(
    node: onnx.NodeProto,
    shapes: dict[str, tuple[int, list[Dim]]],
    initializers: dict[str, onnx.TensorProto],
) -> float | None:
    """The epsilon of an ``RMSNormalization`` the fused kernel computes alike (last axis, float32 statistics, a
    constant float32 1-D scale); ``None`` otherwise."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    known = shapes.get(node.input[0])
    rank = len(known[1]) if known is not None else 0
    if attrs.get("axis", -1) not in (-1, rank - 1) or attrs.get("stash_type", 1) != 1:
        return None
    scale = initializers.get(node.input[1])
    width = known[1][-1] if known is not None and known[1] else None
    if scale is None or scale.data_type != TensorProto.FLOAT or list(scale.dims) != [width]:
        return None
    return float(attrs.get("epsilon", 1e-5))
