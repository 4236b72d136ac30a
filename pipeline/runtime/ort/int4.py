"""INT4 weights on ONNX Runtime: its session fuses ``DequantizeLinear(int4, block) -> MatMul`` into its 4-bit kernel
``com.microsoft::MatMulNBits`` (``DQMatMulToMatMulNBits``). The kernel's *accuracy level* decides what the activations
are computed in; left unset, the fusion uses level 4, which quantizes the activations to int8 per block (measured on
ONNX Runtime 1.32: 0.76% relative error on a 256x128 MatMul, ``LLM_ON_TENSORRT.md``). The session option
``session.qdq_matmulnbits_accuracy_level`` sets it: 1 (float32 activations) gives the exact product (1.5e-6), the
computation TensorRT's W4A16 kernels perform. ``Settings.ort_int4_accuracy_level`` chooses it (default 1).
"""

from __future__ import annotations

import onnx
import onnxruntime as ort

from pipeline.settings import Settings

#: The session config key of the DQ -> MatMulNBits fusion's accuracy level.
ACCURACY_KEY = "session.qdq_matmulnbits_accuracy_level"


def has_int4_weights(model: onnx.ModelProto) -> bool:
    """Does ``model`` hold an INT4 initializer (a 4-bit weight)?"""
    return any(t.data_type == onnx.TensorProto.INT4 for t in model.graph.initializer)


def configure_int4(model: onnx.ModelProto, options: ort.SessionOptions, settings: Settings) -> None:
    """Set the MatMulNBits accuracy level on ``options`` when ``model`` has INT4 weights."""
    if has_int4_weights(model):
        options.add_session_config_entry(ACCURACY_KEY, str(settings.ort_int4_accuracy_level))
