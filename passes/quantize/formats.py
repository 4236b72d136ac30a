"""The 8-bit formats of explicit quantization: INT8 and FP8 (E4M3), their ranges, and symmetric (de)quantization in
numpy, written exactly as ONNX's QuantizeLinear and DequantizeLinear compute them.

* INT8: ``q = saturate(round_half_even(x / scale))`` in [-128, 127], zero point 0 (TensorRT takes only symmetric
  quantization: "the zero point must be 0"). Scales map the calibrated range to +-127 so that the grid is
  symmetric.
* FP8 E4M3 (``FLOAT8E4M3FN``: 4 exponent bits, 3 mantissa bits, no infinities, largest finite 448): ``q =
  saturate(x / scale)`` rounded to the nearest E4M3 value (ties to even), so scales map the range to +-448.
  FP8 Q/DQ exist from ONNX opset 19; TensorRT builds FP8 only for compute capability 8.9 (Ada) and later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx

#: The weighted ops the quantize stage quantizes (the rest of the graph stays in the float type).
QUANTIZED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


@dataclass(frozen=True)
class QuantFormat:
    """An 8-bit target: its names, ONNX and numpy types, the largest magnitude it holds, and the first opset whose
    QuantizeLinear/DequantizeLinear take it (per-axis scales exist from opset 13, float8 from 19)."""

    name: str  # "int8" | "fp8": the value of settings.precision
    dtype_name: str  # "int8" | "float8e4m3fn"
    onnx_type: int
    numpy_type: type
    max_value: float  # 127 (symmetric INT8) | 448 (E4M3FN)
    min_opset: int

    def scale_for(self, amax: np.ndarray | float) -> np.ndarray:
        """The scale that maps ``amax`` to the largest value; an all-zero range gets scale 1 (any scale is exact)."""
        amax = np.asarray(amax, dtype=np.float64)
        return np.where(amax > 0, amax / self.max_value, 1.0).astype(np.float32)

    def quantize(self, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """``QuantizeLinear(values, scale, 0)`` as stored: int8, or ``ml_dtypes.float8_e4m3fn``."""
        scaled = np.asarray(values, np.float32) / np.asarray(scale, np.float32)
        if self.onnx_type == onnx.TensorProto.INT8:
            return np.clip(np.rint(scaled), -128, 127).astype(np.int8)  # np.rint rounds half to even, as ONNX does
        # saturate first: a cast of a value beyond 448 to E4M3FN would give NaN (ONNX's saturate=1 clips instead)
        return np.clip(scaled, -self.max_value, self.max_value).astype(ml_dtypes.float8_e4m3fn)

    def fake_quantize(self, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """``DequantizeLinear(QuantizeLinear(values))`` in float32: what the quantized graph computes with."""
        return self.quantize(values, scale).astype(np.float32) * np.asarray(scale, np.float32)

    def zero_point(self, shape: tuple[int, ...] = ()) -> np.ndarray:
        """The zero point (always 0: symmetric) in the stored type."""
        return np.zeros(shape, dtype=self.numpy_type)


FORMATS: Mapping[str, QuantFormat] = {
    "int8": QuantFormat("int8", "int8", onnx.TensorProto.INT8, np.int8, 127.0, 13),
    "fp8": QuantFormat(
        "fp8",
        "float8e4m3fn",
        onnx.TensorProto.FLOAT8E4M3FN,
        ml_dtypes.float8_e4m3fn,
        float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max),
        19,
    ),
}
