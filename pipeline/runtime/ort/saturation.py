"""uint8 weights for ONNX Runtime's integer kernels on x86 CPUs whose uint8 x int8 products saturate.

ONNX Runtime's CPU integer kernels (QLinearConv, MatMulInteger, MatMulIntegerToFloat, QGemm) multiply uint8
activations by int8 weights. On x86 CPUs with AVX2, or AVX-512 without VNNI, MLAS does it with ``VPMADDUBSW``,
which adds two adjacent products in a *saturating int16*: two products of 255 x 127 give 64,770, stored as 32,767
(measured here, AMD EPYC with AVX2: ``MatMulInteger`` of 64 x 255 by 64 x 127 gives 1,048,544 where the exact sum
is 2,072,640). A convolution of activations near the top of their range then departs from the Q/DQ graph by tens of
percent, not by a rounding. ONNX Runtime's quantization guide names it and offers ``reduce_range`` (7-bit
weights, which changes the model) or uint8 x uint8; VNNI CPUs (``VPDPBUSD``, int32 accumulation) are exact.

So on such a CPU every int8 weight with zero point 0 becomes uint8 with zero point 128 in the session's graph: the
same values (``(q + 128) - 128``), taken by MLAS's uint8 x uint8 kernels, which widen to int16 before multiplying
and are exact. :func:`u8s8_saturates` decides by running the product above once per process, not by reading CPU
flags, so it follows whatever kernel ONNX Runtime picks.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

logger = logging.getLogger(__name__)

_SHIFT = 128
#: The inputs of ``com.microsoft.MatMulIntegerToFloat``: B and its zero point.
_B, _B_ZERO = 1, 5


@functools.cache
def u8s8_saturates() -> bool:
    """Does ONNX Runtime's CPU uint8 x int8 matrix product saturate on this machine (see the module doc)?"""
    a = np.full((1, 64), 255, np.uint8)
    weight = numpy_helper.from_array(np.full((64, 1), 127, np.int8), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
        "u8s8_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = int(session.run(None, {"a": a})[0][0, 0])
    saturates = got != 64 * 255 * 127
    if saturates:
        logger.debug("onnxruntime: uint8 x int8 products saturate on this CPU (no VNNI); int8 weights run as uint8")
    return saturates


def unsigned_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose int8 weights with zero point 0 (read by DequantizeLinear or as
    ``MatMulIntegerToFloat``'s B) are uint8 with zero point 128: the same values; the number of weights switched."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    initializers = {t.name: t for t in graph.initializer}
    switched: dict[str, str] = {}
    done = 0

    def shifted(name: str) -> str:
        if name not in switched:
            values = numpy_helper.to_array(initializers[name]).astype(np.int16) + _SHIFT
            graph.initializer.append(numpy_helper.from_array(values.astype(np.uint8), f"{name}/uint8"))
            switched[name] = f"{name}/uint8"
        return switched[name]

    def zero_is_int8_zero(name: str) -> bool:
        if name == "":
            return True
        tensor = initializers.get(name)
        return tensor is not None and tensor.data_type == TensorProto.INT8 and not numpy_helper.to_array(tensor).any()

    for index, node in enumerate(graph.node):
        if node.op_type == "DequantizeLinear":
            weight, zero_at = 0, 2
        elif node.op_type == "MatMulIntegerToFloat" and node.domain == "com.microsoft":
            weight, zero_at = _B, _B_ZERO
        else:
            continue
        name = node.input[weight] if len(node.input) > weight else ""
        tensor = initializers.get(name)
        if tensor is None or tensor.data_type != TensorProto.INT8:
            continue
        zero_name = node.input[zero_at] if len(node.input) > zero_at else ""
        if not zero_is_int8_zero(zero_name):
            continue
        if node.op_type == "DequantizeLinear":
            scale = initializers.get(node.input[1])
            if scale is None:
                continue
            zero_shape = tuple(scale.dims)
        else:
            zero_shape = tuple(initializers[zero_name].dims) if zero_name else ()
        node.input[weight] = shifted(name)
        zero = numpy_helper.from_array(np.full(zero_shape, _SHIFT, np.uint8), f"{node.name or index}/uint8_zero_point")
        graph.initializer.append(zero)
        while len(node.input) <= zero_at:
            node.input.append("")
        node.input[zero_at] = zero.name
        done += 1
    used = {n for node in graph.node for n in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return out, done
