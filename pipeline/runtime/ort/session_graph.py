"""The graph an ONNX Runtime session runs for a final graph: on the CPU, a float16/bfloat16 graph runs as its float32
emulation, an FP8 or NVFP4 graph as its exact emulation, and an INT8 graph rewritten so that more of it runs in
integer kernels; a cached decoder step runs its attention as ``GroupQueryAttention`` over the filled part of the
cache, and its residual sums with their norms as ``SkipSimplifiedLayerNormalization``; a decomposed attention (an
encoder's) runs as ``MultiHeadAttention``.
``module.onnx`` (TensorRT's graph) stays as it is; only the session sees these."""

from __future__ import annotations

import onnx

from pipeline.runtime.ort.cached_attention import has_cached_attention
from pipeline.runtime.ort.emulation import emulate_fp4, emulate_fp8, has_fp4, has_fp8, has_int8_weights
from pipeline.runtime.ort.grouped_attention import grouped_attention_graph, kernel_available
from pipeline.runtime.ort.half_emulation import emulate_low_precision, has_low_precision
from pipeline.runtime.ort.int8 import ort_int8_graph
from pipeline.runtime.ort.multi_head_attention import multi_head_attention_graph
from pipeline.runtime.ort.skip_norm import skip_norm_graph
from pipeline.settings import Settings


def runnable_model(model: onnx.ModelProto, backend: str, settings: Settings) -> onnx.ModelProto:
    """The graph the backend runs: ONNX Runtime on the CPU runs a float16/bfloat16 graph's float32 emulation, an
    FP8 or NVFP4 graph's exact emulation (:mod:`pipeline.runtime.ort.emulation`), and an INT8 graph rewritten so that
    more of it runs in integer kernels (:mod:`pipeline.runtime.ort.int8`: the same quantization, plus the recorded
    convolution outputs with ``settings.ort_int8_conv_outputs="requantize"``), and a cached decoder step with
    ``GroupQueryAttention`` (:mod:`pipeline.runtime.ort.grouped_attention`; ``settings.ort_grouped_attention``) and
    ``SkipSimplifiedLayerNormalization`` (:mod:`pipeline.runtime.ort.skip_norm`), and a decomposed attention with
    ``MultiHeadAttention`` (:mod:`pipeline.runtime.ort.multi_head_attention`)."""
    if backend != "onnxruntime":
        return model
    if rewrites(model, settings):
        model = _rewritten(model, settings)
    if grouped_attention(model, settings):
        model = grouped_attention_graph(model)  # a copy
        model = skip_norm_graph(model)  # residual Add + RMSNormalization as one kernel, on that copy
    if plain_attention(model, settings):
        model = multi_head_attention_graph(model)  # a copy, when an attention matches
    return model


def _rewritten(model: onnx.ModelProto, settings: Settings) -> onnx.ModelProto:
    if has_fp4(model):
        model = emulate_fp4(model)  # NVFP4: no FP4 kernel on ONNX Runtime
    if has_fp8(model):
        model = emulate_fp8(model)
    if has_int8_weights(model):
        model = ort_int8_graph(model, settings.ort_int8_conv_outputs)  # more of it in integer kernels
    if emulated_on_cpu(model, settings):
        return emulate_low_precision(model)
    return model


def rewrites(model: onnx.ModelProto, settings: Settings) -> bool:
    """Does ONNX Runtime's session run a rewrite of ``model`` (:func:`runnable_model`) rather than the graph as it
    is? Those rewrites read the weights from the graph, so the executor reads external weights in first."""
    return has_fp4(model) or has_fp8(model) or has_int8_weights(model) or emulated_on_cpu(model, settings)


def emulated_on_cpu(model: onnx.ModelProto, settings: Settings) -> bool:
    """Does ONNX Runtime run this half graph through the float32 emulation (CPU provider only)?"""
    cpu_only = set(settings.ort_providers) <= {"CPUExecutionProvider"}
    return settings.precision != "fp32" and cpu_only and has_low_precision(model)


def plain_attention(model: onnx.ModelProto, settings: Settings) -> bool:
    """Does the session run ``model``'s decomposed attention (``MatMul``, ``Softmax``, ``MatMul``: an encoder exported
    below opset 23) as ``MultiHeadAttention`` (:mod:`pipeline.runtime.ort.multi_head_attention`; CPU provider)? The
    rewrite itself finds where it is exact."""
    cpu_only = set(settings.ort_providers) <= {"CPUExecutionProvider"}
    return cpu_only and any(n.op_type == "Softmax" for n in model.graph.node)


def grouped_attention(model: onnx.ModelProto, settings: Settings) -> bool:
    """Does the session run ``model``'s cached attention as ``GroupQueryAttention`` (a generation step on the CPU
    provider, float32 after any emulation, ``settings.ort_grouped_attention`` on, ONNX Runtime 1.22 or later)?"""
    cpu_only = set(settings.ort_providers) <= {"CPUExecutionProvider"}
    return (
        settings.generation is not None
        and settings.ort_grouped_attention
        and cpu_only
        and kernel_available()
        and has_cached_attention(model)
    )
