"""NVFP4 activations on ONNX Runtime, exactly: ONNX Runtime has no ``trt::TRT_FP4DynamicQuantize`` and no FP4 type
in its kernels, so each ``TRT_FP4DynamicQuantize -> DequantizeLinear (scales) -> DequantizeLinear (values)`` chain
(:mod:`passes.quantize.dynamic_fp4`) becomes float32 ops computing the same values:

1. the blocks of 16 along the last axis (``Reshape`` to ``[-1, 16]``: the axis is a multiple of 16) and each
   block's largest magnitude;
2. the FP8 block scale ``E4M3((amax / 6) / scale2)`` (ModelOpt's order: ``amax / 6``, then the per-tensor scale),
   by ``Cast`` to FLOAT8E4M3FN with ``saturate=1``: rounding to nearest even, saturating at 448 when the
   activation exceeds its calibrated range; then ``fp8 x scale2`` in float32, what the first DequantizeLinear gives;
3. the E2M1 value of ``x / block scale``: its magnitude clamped to 6 (saturation) and rounded half to even on the
   grid's spacing, which is 0.5 below 2, 1 below 4 and 2 up to 6 (``Round`` is half to even, and each spacing is a
   power of two, so the division is exact); a block whose scale is 0 (all zeros, or below E4M3's smallest value)
   gives 0;
4. ``value x block scale`` in float32, what the second DequantizeLinear gives.

``module.onnx`` keeps the real chain that TensorRT builds; the report's notes say the emulation ran.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.errors import ConversionError
from passes.quantize.blockwise import FP4_MAX, NVFP4_BLOCK
from passes.quantize.dynamic_fp4 import DYNAMIC_QUANTIZE

_FLOAT = onnx.TensorProto.FLOAT
_FP8 = onnx.TensorProto.FLOAT8E4M3FN
#: Constants the emulation reads (float32 unless int64), shared by every chain.
_CONSTANTS: dict[str, np.ndarray] = {
    "blocks_shape": np.array([-1, NVFP4_BLOCK], np.int64),
    "reduce_axes": np.array([1], np.int64),
    "fp4_max": np.array(FP4_MAX, np.float32),
    "zero": np.array(0.0, np.float32),
    "half": np.array(0.5, np.float32),
    "one": np.array(1.0, np.float32),
    "two": np.array(2.0, np.float32),
    "four": np.array(4.0, np.float32),
}


def emulate_dynamic_fp4(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every NVFP4 activation chain spelled out in float32 ops (see the module doc)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    quantizers = [n for n in graph.node if n.op_type == DYNAMIC_QUANTIZE]
    if not quantizers:
        return out
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    prefix = "nvfp4_emulation"
    graph.initializer.extend(numpy_helper.from_array(v, f"{prefix}/{k}") for k, v in _CONSTANTS.items())
    replaced: dict[str, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for quantizer in quantizers:
        scale_dq, value_dq = _dequantizers(quantizer, readers)
        replaced[quantizer.name] = _spelled_out(quantizer, value_dq.output[0], prefix)
        removed.update({id(scale_dq), id(value_dq)})
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == DYNAMIC_QUANTIZE:
            nodes.extend(replaced[node.name])
        elif id(node) not in removed:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def _dequantizers(
    quantizer: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]]
) -> tuple[onnx.NodeProto, onnx.NodeProto]:
    """The chain's two DequantizeLinear nodes; a ConversionError when the graph holds another form."""
    values = readers.get(quantizer.output[0], [])
    scales = readers.get(quantizer.output[1], [])
    if (
        len(values) == 1
        and len(scales) == 1
        and values[0].op_type == scales[0].op_type == "DequantizeLinear"
        and values[0].input[1] == scales[0].output[0]
        and len(readers.get(scales[0].output[0], [])) == 1
    ):
        return scales[0], values[0]
    raise ConversionError(
        f"backend onnxruntime: {DYNAMIC_QUANTIZE} node {quantizer.name!r} is not followed by the two "
        "DequantizeLinear nodes of ModelOpt's form, so its ONNX Runtime emulation cannot be built",
        fix="write the chain as TRT_FP4DynamicQuantize -> DequantizeLinear(scales, scale2) -> "
        "DequantizeLinear(values, those, axis=-1, block_size=16), or run it on TensorRT",
    )


def _spelled_out(quantizer: onnx.NodeProto, output: str, prefix: str) -> list[onnx.NodeProto]:
    """The float32 ops that compute ``output`` (the value DequantizeLinear's result) from the quantizer's input."""
    base = f"{quantizer.name}/emulate"
    c = {k: f"{prefix}/{k}" for k in _CONSTANTS}
    nodes: list[onnx.NodeProto] = []

    def op(kind: str, inputs: list[str], name: str, **attrs: Any) -> str:
        result = f"{base}/{name}"
        nodes.append(helper.make_node(kind, inputs, [result], name=result, **attrs))
        return result

    wide = op("Cast", [quantizer.input[0]], "input_float", to=_FLOAT)
    scale2 = op("Cast", [quantizer.input[1]], "scale2", to=_FLOAT)
    blocks = op("Reshape", [wide, c["blocks_shape"]], "blocks")
    amax = op("ReduceMax", [op("Abs", [blocks], "magnitudes"), c["reduce_axes"]], "amax", keepdims=1)
    wanted = op("Div", [op("Div", [amax, c["fp4_max"]], "amax_over_6"), scale2], "wanted_scale")
    fp8 = op("Cast", [wanted], "block_scale_fp8", to=_FP8, saturate=1)
    scale = op("Mul", [op("Cast", [fp8], "block_scale_fp8_wide", to=_FLOAT), scale2], "block_scale")
    ratio = op("Div", [blocks, scale], "ratio")
    ratio = op("Where", [op("Equal", [scale, c["zero"]], "scale_is_zero"), c["zero"], ratio], "ratio_safe")
    magnitude = op("Min", [op("Abs", [ratio], "ratio_magnitude"), c["fp4_max"]], "saturated")
    coarse = op("Where", [op("Less", [magnitude, c["four"]], "below_4"), c["one"], c["two"]], "spacing_from_2")
    spacing = op("Where", [op("Less", [magnitude, c["two"]], "below_2"), c["half"], coarse], "spacing")
    rounded = op("Mul", [op("Round", [op("Div", [magnitude, spacing], "steps")], "rounded_steps"), spacing], "fp4_abs")
    fp4 = op("Mul", [op("Sign", [ratio], "sign"), rounded], "fp4")
    dequantized = op("Mul", [fp4, scale], "dequantized_blocks")
    shape = op("Shape", [wide], "input_shape")
    nodes.append(helper.make_node("Reshape", [dequantized, shape], [output], name=f"{base}/dequantized"))
    return nodes
