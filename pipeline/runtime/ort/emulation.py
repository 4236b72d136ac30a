"""FP8 on ONNX Runtime's CPU provider, exactly: what that backend runs instead of an FP8 Q/DQ graph.

ONNX Runtime (1.32) has CPU kernels for QuantizeLinear/DequantizeLinear on FLOAT8E4M3FN and they are exact, but its
extended graph optimizations rewrite FP8 Q/DQ around Conv/MatMul as if they were INT8 (measured: a trained digits
CNN's logits off by 12.6 with ``ORT_ENABLE_EXTENDED``, 0.58 with ``ORT_ENABLE_BASIC``, against PyTorch fp32). The
emulation spells each FP8 pair out with ops that optimization leaves alone:

* activation ``QuantizeLinear -> DequantizeLinear`` becomes ``Div(scale) -> Cast(to=FLOAT8E4M3FN) -> Cast(back)
  -> Mul(scale)``: Cast-19 to E4M3FN saturates and rounds to nearest even, as QuantizeLinear does, so the values are
  the same bit for bit;
* a weight's ``DequantizeLinear`` becomes the initializer it computes (E4M3 value x scale, in the scale's type).

``module.onnx`` stays the real FP8 Q/DQ graph that TensorRT builds. INT8 graphs run as
:mod:`pipeline.runtime.ort.int8` rewrites them for ONNX Runtime; its last step gives the convolutions ONNX Runtime
does not fuse their weights already dequantized (:func:`fold_unfused_weights`, exact).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from passes.quantize.blockwise import FLOAT4E2M1
from passes.quantize.dynamic_fp4 import DYNAMIC_QUANTIZE
from pipeline.runtime.ort.dynamic_emulation import emulate_dynamic_fp4

FP8 = onnx.TensorProto.FLOAT8E4M3FN
FP4 = FLOAT4E2M1


def has_fp8(model: onnx.ModelProto) -> bool:
    """Does ``model`` hold an FP8 initializer (a quantized weight or zero point)?"""
    return any(t.data_type == FP8 for t in model.graph.initializer)


def emulate_fp8(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same computation without FP8 QuantizeLinear/DequantizeLinear nodes (see the module doc)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    initializers = {t.name: t for t in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and _is_fp8(node, initializers):
            nodes.extend(_rounding(node, initializers))
        elif node.op_type == "DequantizeLinear" and _is_fp8(node, initializers):
            if node.input[0] in initializers:
                graph.initializer.append(_dequantized_weight(node, initializers))
            else:
                scale_type = initializers[node.input[1]].data_type
                wide = f"{node.output[0]}__wide"
                nodes.append(
                    helper.make_node("Cast", [node.input[0]], [wide], name=f"{node.name}/emulate_cast", to=scale_type)
                )
                nodes.append(
                    helper.make_node("Mul", [wide, node.input[1]], list(node.output), name=f"{node.name}/emulate_mul")
                )
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for n in graph.node for name in n.input}
    kept = [t for t in graph.initializer if t.name in used]  # stored weights, zero points and scales now unused
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return out


def _is_fp8(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    zero = initializers.get(node.input[2]) if len(node.input) > 2 else None
    data = initializers.get(node.input[0])
    return (zero is not None and zero.data_type == FP8) or (data is not None and data.data_type == FP8)


def _rounding(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> list[onnx.NodeProto]:
    """``QuantizeLinear`` -> ``Div`` then ``Cast`` to E4M3FN (saturating); its DequantizeLinear widens it back."""
    scaled = f"{node.output[0]}__scaled"
    return [
        helper.make_node("Div", [node.input[0], node.input[1]], [scaled], name=f"{node.name}/emulate_div"),
        helper.make_node("Cast", [scaled], list(node.output), name=f"{node.name}/emulate_fp8", to=FP8, saturate=1),
    ]


def _dequantized_weight(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> onnx.TensorProto:
    values = numpy_helper.to_array(initializers[node.input[0]]).astype(np.float32)
    scale_tensor = initializers[node.input[1]]
    scale = numpy_helper.to_array(scale_tensor).astype(np.float32)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * values.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
    float_type = helper.tensor_dtype_to_np_dtype(scale_tensor.data_type)
    return numpy_helper.from_array((values * scale).astype(float_type), node.output[0])


def has_int8_weights(model: onnx.ModelProto) -> bool:
    """Does ``model`` hold an INT8 initializer read by a DequantizeLinear (a quantized weight)?"""
    int8 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    return any(n.op_type == "DequantizeLinear" and n.input[0] in int8 for n in model.graph.node)


def fold_unfused_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The INT8 graph as ONNX Runtime's CPU provider runs it fastest, computing the same values: the quantized weight
    of every Conv that ONNX Runtime will not fuse into QLinearConv becomes the float32 initializer its
    DequantizeLinear computes (``q * scale`` in float32, as the kernel does: exact).

    ONNX Runtime fuses ``DQ -> Conv -> Q`` only when the Conv's one reader is a QuantizeLinear
    (``NodeGroupSelector::CheckQDQNodes``); any other Conv runs in float, and with a DequantizeLinear output as its
    weight it gets neither pre-packed weights nor the blocked NCHWc layout (which want a constant weight), so it
    runs 1.5-3x slower than the same Conv in the float32 graph. TensorRT's placement leaves three kinds unfused:
    Convs before a residual Add, the first Conv before a pooling, and Convs whose output is a graph output.
    ``module.onnx`` keeps the real Q/DQ graph; only float32 scales are folded (a float16 scale's product would round
    differently)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    initializers = {t.name: t for t in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    producers = {o: n for n in graph.node for o in n.output}
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type != "Conv" or len(node.input) < 2:
            continue
        after = readers.get(node.output[0], [])
        if len(after) == 1 and after[0].op_type == "QuantizeLinear" and node.output[0] not in outputs:
            continue  # ONNX Runtime fuses this one into QLinearConv
        weight = producers.get(node.input[1])
        if weight is None or weight.op_type != "DequantizeLinear" or weight.input[0] not in initializers:
            continue
        if initializers[weight.input[1]].data_type != onnx.TensorProto.FLOAT:
            continue
        folded = _dequantized_weight(weight, initializers)
        folded.name = f"{weight.output[0]}/folded"
        graph.initializer.append(folded)
        node.input[1] = folded.name
    read = {name for n in graph.node for name in n.input} | outputs
    kept_nodes = [n for n in graph.node if n.op_type != "DequantizeLinear" or any(o in read for o in n.output)]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    used = {name for n in graph.node for name in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return out


def has_fp4(model: onnx.ModelProto) -> bool:
    """Does ``model`` hold an FP4 (NVFP4) initializer or quantize activations to NVFP4?"""
    return any(t.data_type == FP4 for t in model.graph.initializer) or any(
        n.op_type == DYNAMIC_QUANTIZE for n in model.graph.node
    )


def emulate_fp4(model: onnx.ModelProto) -> onnx.ModelProto:
    """NVFP4 weights on ONNX Runtime, which has no FLOAT4E2M1 DequantizeLinear: each ``DequantizeLinear(fp8 block
    scales, float32 scale2) -> DequantizeLinear(fp4 weight, block scales)`` chain becomes the float32 initializer it
    computes (``fp4 x (fp8 x scale2)``, each product rounded to float32 as the spec's float32 arithmetic does): the
    same values bit for bit; the Transpose and Cast after it stay in the graph. NVFP4 activations
    (``nvfp4_activations``) run as :func:`emulate_dynamic_fp4` spells them out."""
    out = emulate_dynamic_fp4(model)
    graph = out.graph
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    folded: set[str] = set()
    for node in graph.node:
        weight = initializers.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if weight is None or weight.data_type != FP4:
            continue
        if node.input[1] in initializers:  # the FP8 scale chain already folded (emulate_fp8 ran first)
            scales = numpy_helper.to_array(initializers[node.input[1]]).astype(np.float32)
        else:
            scaler = producers[node.input[1]]
            block_scales = numpy_helper.to_array(initializers[scaler.input[0]]).astype(np.float32)
            scale2 = numpy_helper.to_array(initializers[scaler.input[1]]).astype(np.float32)
            scales = (block_scales * scale2).astype(np.float32)
            folded.add(scaler.name)
        values = numpy_helper.to_array(weight).astype(np.float32)
        block = next(a.i for a in node.attribute if a.name == "block_size")
        expanded = np.repeat(scales, block, axis=-1)[..., : values.shape[-1]]
        graph.initializer.append(numpy_helper.from_array((values * expanded).astype(np.float32), node.output[0]))
        folded.add(node.name)
    kept_nodes = [n for n in graph.node if n.name not in folded]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    used = {name for n in graph.node for name in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return out
