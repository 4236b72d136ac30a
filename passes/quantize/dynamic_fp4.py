"""NVFP4 activations (W4A4): each 4-bit MatMul's activation is quantized to NVFP4 at run time, in the form NVIDIA
ModelOpt exports for TensorRT (its ``export_fp4`` with a dynamic input quantizer) and TensorRT-RTX builds for
compute capability 12.x (``LLM_ON_TENSORRT.md``, "NVFP4 activations by trt::TRT_FP4DynamicQuantize")::

    x --TRT_FP4DynamicQuantize(x, scale2; domain "trt", axis=-1, block_size=16, scale_type=FLOAT8E4M3FN)--> x_fp4, s_fp8
    DequantizeLinear(s_fp8, scale2) -> block scales (float32)
    DequantizeLinear(x_fp4, block scales, axis=-1, block_size=16) -> x' (float32) [-> Cast to the graph's float type]

TensorRT's DynamicQuantize layer computes, per block of 16 along the last axis, the FP8 E4M3 block scale from the
block's largest magnitude (``amax / 6``, divided by the per-tensor ``scale2`` and rounded to E4M3) and the E2M1
values of ``x / (fp8 scale x scale2)``; ``scale2`` is a build-time constant, ``amax / (6 * 448)`` of the activation's
calibrated largest magnitude (ModelOpt's ``sx_f32_per_tensor``). The layer takes 2-D and 3-D inputs whose last axis
is a build-time multiple of 16. ONNX Runtime has no such op: :func:`pipeline.runtime.ort.emulation.emulate_fp4` spells
it out exactly. A tensor read by several MatMuls is quantized once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.quantize.blockwise import FLOAT4E2M1, FP4_MAX, FP8_MAX, NVFP4_BLOCK

#: The op, its domain and its attributes (ModelOpt's ``_fp4_dynamic_quantize``).
DYNAMIC_QUANTIZE = "TRT_FP4DynamicQuantize"
DOMAIN = "trt"


def activation_scale(amax: float) -> float:
    """The per-tensor scale of an activation whose calibrated largest magnitude is ``amax``: ``amax / (6 * 448)``
    (1 when it is 0, as ModelOpt does); a block reaching ``amax`` gets the FP8 scale 448."""
    return float(np.float32(amax / (FP4_MAX * FP8_MAX))) if amax > 0 else 1.0


def quantizable(tensor: gs.Tensor) -> str | None:
    """Why TensorRT's DynamicQuantize cannot take ``tensor`` (None when it can): 2-D or 3-D, last axis a constant
    multiple of 16."""
    shape = tensor.shape
    if shape is None or len(shape) not in (2, 3):
        return f"nvfp4_activations: TensorRT quantizes 2-D and 3-D activations, {tensor.name!r} has shape {shape}"
    if not isinstance(shape[-1], int) or shape[-1] % NVFP4_BLOCK:
        return f"nvfp4_activations: the last axis of {tensor.name!r} ({shape[-1]}) is not a constant multiple of 16"
    return None


def quantize_activations(graph: gs.Graph, inputs: Sequence[tuple[str, int]], scales: Mapping[str, float]) -> int:
    """Quantize the activation at ``(node name, input position)`` of each entry to NVFP4 (see the module doc), with
    ``scales[node name]`` as the per-tensor scale; the number of activation tensors quantized. Entries that read one
    tensor share one chain (with the largest of their scales)."""
    nodes = {n.name: n for n in graph.nodes}
    readers: dict[str, list[tuple[gs.Node, int]]] = {}
    tensors: dict[str, gs.Tensor] = {}
    for name, position in inputs:
        tensor = nodes[name].inputs[position]
        readers.setdefault(tensor.name, []).append((nodes[name], position))
        tensors[tensor.name] = tensor
    for tensor_name, using in readers.items():
        scale2 = max(scales[node.name] for node, _ in using)
        out = _chain(graph, tensors[tensor_name], scale2)
        for node, position in using:
            node.inputs[position] = out
    graph.cleanup().toposort()
    return len(readers)


def _chain(graph: gs.Graph, source: gs.Tensor, scale2: float) -> gs.Variable:
    """TRT_FP4DynamicQuantize -> DequantizeLinear (scales) -> DequantizeLinear (values) [-> Cast]."""
    base = f"{source.name}/input_nvfp4"
    float_type = np.dtype(source.dtype) if source.dtype is not None else np.dtype(np.float32)
    shape = list(source.shape or [])
    scale = gs.Constant(f"{base}/scale2", np.asarray(scale2, np.float32))
    values = gs.Variable(f"{base}/fp4", dtype=FLOAT4E2M1, shape=shape)
    block_scales_fp8 = gs.Variable(f"{base}/block_scales_fp8", dtype=onnx.TensorProto.FLOAT8E4M3FN)
    block_scales = gs.Variable(f"{base}/block_scales", dtype=np.float32)
    dequantized = gs.Variable(f"{base}/dequantized", dtype=np.float32, shape=shape)
    graph.nodes.append(
        gs.Node(
            DYNAMIC_QUANTIZE,
            f"{base}/{DYNAMIC_QUANTIZE}",
            attrs={"axis": -1, "block_size": NVFP4_BLOCK, "scale_type": onnx.TensorProto.FLOAT8E4M3FN},
            inputs=[source, scale],
            outputs=[values, block_scales_fp8],
            domain=DOMAIN,
        )
    )
    graph.nodes.append(
        gs.Node(
            "DequantizeLinear",
            f"{base}/scale_DequantizeLinear",
            inputs=[block_scales_fp8, scale],
            outputs=[block_scales],
        )
    )
    graph.nodes.append(
        gs.Node(
            "DequantizeLinear",
            f"{base}/DequantizeLinear",
            attrs={"axis": -1, "block_size": NVFP4_BLOCK},
            inputs=[values, block_scales],
            outputs=[dequantized],
        )
    )
    if float_type == np.float32:
        return dequantized
    cast = gs.Variable(f"{base}/dequantized_{float_type.name}", dtype=float_type, shape=shape)
    to = int(onnx.helper.np_dtype_to_tensor_dtype(float_type))
    graph.nodes.append(gs.Node("Cast", f"{base}/Cast", attrs={"to": to}, inputs=[dequantized], outputs=[cast]))
    return cast
