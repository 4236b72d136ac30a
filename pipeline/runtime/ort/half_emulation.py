"""Half types on a CPU, faithfully: what ONNX Runtime's CPU provider runs instead of a float16 or bfloat16 graph.

* bfloat16: the CPU provider has no bfloat16 kernel for MatMul, Conv, Gemm, Add, Softmax and most other compute ops
  (only casts, LayerNormalization and data movement), so a bfloat16 graph does not run there at all.
* float16: it runs, but Conv, Gemm, ConvTranspose, BatchNormalization and InstanceNormalization have no float16 CPU
  kernel; ONNX Runtime computes them in float32 between casts it inserts, then removes the casts it inserted between
  two such ops, and may move neighbours to float32 too. A float16 tensor TensorRT would overflow to inf can then
  come out finite (measured: a Gemm output of 1.4e5 feeding a LayerNormalization).

:func:`emulate_low_precision` gives the graph that runs and rounds where the real one rounds: every float16/bfloat16
tensor becomes a float32 tensor holding exactly the half value (weights widened exactly; every node output rounded
with an explicit ``Cast(to=half) -> Cast(to=FLOAT)`` pair, which ONNX Runtime keeps; round-to-nearest-even, inf
beyond the range, like TensorRT). Half graph inputs and outputs (``precision_io="low"``) keep their type, with exact
casts at the boundary, so the emulation is fed and answers like the real graph. Arithmetic *inside* one op is float32,
as in TensorRT's half kernels that accumulate in float32. What it cannot show: TensorRT fusing two ops and skipping the
rounding between them (the emulation is then slightly pessimistic), or a kernel that accumulates in the half type.
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from passes.precision.types import FOLLOWER_OPS

HALF = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
FLOAT = onnx.TensorProto.FLOAT


def has_low_precision(model: onnx.ModelProto) -> bool:
    """Does ``model`` hold a float16 or bfloat16 tensor (input, output, value, weight, or cast target)?"""
    graph = model.graph
    typed = [*graph.input, *graph.output, *graph.value_info]
    return (
        any(v.type.tensor_type.elem_type in HALF for v in typed)
        or any(t.data_type in HALF for t in graph.initializer)
        or any(n.op_type == "Cast" and _attr(n, "to") in HALF for n in graph.node)
    )


def emulate_low_precision(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float32 model that rounds to float16 or bfloat16 wherever ``model`` holds one (see the module doc)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    typed = [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]
    half = {v.name: v.type.tensor_type.elem_type for v in typed if v.type.tensor_type.elem_type in HALF}
    half.update({t.name: t.data_type for t in model.graph.initializer if t.data_type in HALF})
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    nodes = []
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type not in HALF:
            continue
        if uses_external_data(tensor):  # stays in its file (a large model): widened by a Cast when the session runs
            stored = f"{tensor.name}__emulated_stored"
            widen = helper.make_node("Cast", [stored], [tensor.name], name=f"{tensor.name}/emulate_fp32", to=FLOAT)
            nodes.append(widen)
            tensor.name = stored
        else:
            graph.initializer[index].CopyFrom(_widened(tensor))
    for node in graph.node:
        _widen_attributes(node)
        nodes.append(node)
        if node.op_type in FOLLOWER_OPS:
            continue  # moves half values around: already exact
        for position, name in enumerate(node.output):
            if name in half:
                nodes.extend(_round(node, position, name, half[name]))
    del graph.node[:]
    graph.node.extend(nodes)
    for value in graph.value_info:
        if value.type.tensor_type.elem_type in HALF:
            value.type.tensor_type.elem_type = FLOAT
    _keep_half_boundary(graph)
    return out


def _keep_half_boundary(graph: onnx.GraphProto) -> None:
    """Half graph inputs and outputs keep their type (the emulation is called like the real graph): a cast widens
    each such input, and narrows each such output, whose value already holds a half value: both are exact."""
    half = {v.name: v.type.tensor_type.elem_type for v in graph.output if v.type.tensor_type.elem_type in HALF}
    half.update({v.name: v.type.tensor_type.elem_type for v in graph.input if v.type.tensor_type.elem_type in HALF})
    if not half:
        return
    renamed = {name: f"{name}__emulated_boundary" for name in half}
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        node.output[:] = [renamed.get(name, name) for name in node.output]
    inputs = {v.name for v in graph.input}
    widen = [
        helper.make_node("Cast", [n], [renamed[n]], name=f"{n}/emulate_fp32", to=FLOAT) for n in half if n in inputs
    ]
    narrow = [
        helper.make_node("Cast", [renamed[n]], [n], name=f"{n}/emulate_half", to=elem)
        for n, elem in half.items()
        if n not in inputs
    ]
    nodes = [*widen, *graph.node, *narrow]
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [v for v in graph.value_info if v.name not in half]
    del graph.value_info[:]
    graph.value_info.extend(kept)


def _round(node: onnx.NodeProto, position: int, name: str, half: int) -> list[onnx.NodeProto]:
    raw, narrowed = f"{name}__emulated_fp32", f"{name}__emulated_half"
    node.output[position] = raw
    return [
        helper.make_node("Cast", [raw], [narrowed], name=f"{node.name}/emulate_half_{position}", to=half),
        helper.make_node("Cast", [narrowed], [name], name=f"{node.name}/emulate_fp32_{position}", to=FLOAT),
    ]


def _widened(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype("float32"), tensor.name)


def _widen_attributes(node: onnx.NodeProto) -> None:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type in HALF:
            attribute.t.CopyFrom(_widened(attribute.t))
        elif attribute.name in ("to", "dtype") and attribute.type == onnx.AttributeProto.INT and attribute.i in HALF:
            attribute.i = FLOAT


def _attr(node: onnx.NodeProto, name: str) -> int | None:
    return next((a.i for a in node.attribute if a.name == name), None)
