"""The 4-bit weight formats: INT4 with one scale per block of input channels, and NVFP4 (FP4 E2M1 values, an FP8
E4M3 scale per block of 16 and one float32 scale per tensor), quantized in numpy exactly as ONNX's
``DequantizeLinear`` (opset 21 blocked, opset 23 for FLOAT4E2M1) reads them back.

* **INT4** (W4A16, symmetric, zero point 0: TensorRT rejects others, "Non-zero zero point is not supported"):
  ``scale = amax_block / 7`` and ``q = clip(round_half_even(w / scale), -8, 7)``, the form of NVIDIA ModelOpt's
  INT4 weight quantizer (``maxbound = 2**(bits - 1) - 1``). Blocks run along the input (reduction) dimension, as
  TensorRT's block quantization requires: ``block_size`` 32 to 128 (TensorRT-RTX builds them for compute
  capability 8.0 and later).
* **NVFP4** (ModelOpt's two-level form, ``NVFP4QTensor``): ``scale2 = amax_tensor / (6 * 448)`` per tensor, each
  block of 16's scale ``amax_block / (6 * scale2)`` stored as FP8 E4M3 (a zero block gets 1), and ``q =
  fp4(w / (fp8_scale * scale2))`` rounded to the nearest E2M1 value (ties to even, saturating at 6). TensorRT-RTX
  builds it for compute capability 12.0 and 12.1 only.

``dequantize`` computes what the graph's DequantizeLinear chain gives, in float32, so tests and the activation-aware
search (:mod:`pipeline.quantize.awq`) see the graph's exact values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx

#: The largest E4M3 and E2M1 magnitudes.
FP8_MAX = 448.0
FP4_MAX = 6.0
#: NVFP4's block size is fixed by the format (TensorRT's FP4 kernels and ModelOpt's exporter).
NVFP4_BLOCK = 16


@dataclass(frozen=True)
class BlockFormat:
    """A 4-bit weight format: its names, stored ONNX type, the opset its DequantizeLinear needs, the block size it
    forces (NVFP4: 16) and the lowest compute capability TensorRT builds it for."""

    name: str  # "int4" | "nvfp4": the value of settings.precision
    dtype_name: str  # "int4" | "float4e2m1"
    onnx_type: int
    min_opset: int
    fixed_block: int | None
    min_compute_capability: tuple[int, int]

    def block_size(self, requested: int) -> int:
        """The block size used: the format's own (NVFP4) or the requested one."""
        return self.fixed_block or requested


@dataclass(frozen=True)
class BlockQuantized:
    """A weight ``[N, K]`` (output channels, input channels) in 4 bits: the stored values, the block scales ``[N,
    K / block]`` and, for NVFP4, the per-tensor scale that dequantizes the FP8 block scales."""

    values: np.ndarray  # ml_dtypes.int4 or ml_dtypes.float4_e2m1fn, [N, K]
    scales: np.ndarray  # float32 (INT4) or ml_dtypes.float8_e4m3fn (NVFP4), [N, K // block]
    scale2: float | None  # NVFP4 only
    block: int


def _blocks(weight: np.ndarray, block: int) -> np.ndarray:
    """``[N, K]`` -> ``[N, K // block, block]``; ``K`` must be a multiple of ``block``."""
    rows, columns = weight.shape
    return weight.reshape(rows, columns // block, block)


def quantize_int4(weight: np.ndarray, block: int, scale_type: type = np.float32) -> BlockQuantized:
    """Symmetric INT4 of ``weight [N, K]`` with one scale per ``block`` input channels, scales rounded to
    ``scale_type`` first (the graph's float type) so that ``DequantizeLinear`` of the stored values is exact."""
    wide = _blocks(np.asarray(weight, np.float32), block)
    amax = np.abs(wide).max(axis=2)
    scales: np.ndarray = np.where(amax > 0, amax / 7.0, 1.0).astype(scale_type)
    scales = np.where(scales > 0, scales, np.ones_like(scales))  # a scale that underflows the type: harmless 1
    wide_scales = scales.astype(np.float32)[:, :, None]
    q = np.clip(np.rint(wide / wide_scales), -8, 7).astype(ml_dtypes.int4)
    return BlockQuantized(q.reshape(weight.shape), scales, None, block)


#: The non-negative E2M1 values, and the rounding boundaries between neighbours with the side ties go to (ties to
#: even: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4).
_FP4_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
_FP4_UP_AT = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def round_fp4(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to the nearest FP4 E2M1 value (ties to even, saturating at 6), as float32: what a cast to
    ``ml_dtypes.float4_e2m1fn`` gives, without its per-element conversion (the AWQ search rounds many candidates)."""
    magnitude = np.abs(values)
    index = np.zeros(values.shape, np.int64)
    for bound, inclusive in _FP4_UP_AT:
        index += (magnitude >= bound) if inclusive else (magnitude > bound)
    return (np.sign(values) * _FP4_GRID[index]).astype(np.float32)


def _nvfp4_parts(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """NVFP4 of ``weight [N, K]``: the E2M1 values (as float32, ``[N, K / 16, 16]``), the FP8 block scales and the
    per-tensor scale."""
    wide = _blocks(np.asarray(weight, np.float32), NVFP4_BLOCK)
    tensor_amax = float(np.abs(wide).max(initial=0.0))
    scale2 = np.float32(tensor_amax / (FP4_MAX * FP8_MAX)) if tensor_amax > 0 else np.float32(1.0)
    block_amax = np.abs(wide).max(axis=2)
    wanted = block_amax / (FP4_MAX * scale2)
    wanted = np.where(wanted > 0, wanted, 1.0)
    scales = np.clip(wanted, 0, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    block_scales = (scales.astype(np.float32) * scale2).astype(np.float32)  # the first DequantizeLinear
    safe = np.where(block_scales > 0, block_scales, 1.0)[:, :, None]  # an FP8 scale that underflowed to 0
    return round_fp4(wide / safe), scales, scale2


def quantize_nvfp4(weight: np.ndarray) -> BlockQuantized:
    """NVFP4 of ``weight [N, K]`` (see the module doc)."""
    values, scales, scale2 = _nvfp4_parts(weight)
    stored = values.reshape(weight.shape).astype(ml_dtypes.float4_e2m1fn)  # exact: the values are on the grid
    return BlockQuantized(stored, scales, float(scale2), NVFP4_BLOCK)


def quantize(fmt: BlockFormat, weight: np.ndarray, block: int, scale_type: type = np.float32) -> BlockQuantized:
    """``weight [N, K]`` in ``fmt``."""
    if fmt.name == "nvfp4":
        return quantize_nvfp4(weight)
    return quantize_int4(weight, block, scale_type)


def dequantize(quantized: BlockQuantized) -> np.ndarray:
    """What the graph's DequantizeLinear chain computes from ``quantized``, in float32, ``[N, K]``."""
    scales = quantized.scales.astype(np.float32)
    if quantized.scale2 is not None:
        scales = (scales * np.float32(quantized.scale2)).astype(np.float32)
    values = _blocks(quantized.values.astype(np.float32), quantized.block)
    return (values * scales[:, :, None]).reshape(quantized.values.shape).astype(np.float32)


def fake_quantize(fmt: BlockFormat, weight: np.ndarray, block: int, scale_type: type = np.float32) -> np.ndarray:
    """``dequantize(quantize(weight))``: the weight the 4-bit graph computes with."""
    if fmt.name == "nvfp4":
        values, scales, scale2 = _nvfp4_parts(weight)
        block_scales = (scales.astype(np.float32) * scale2).astype(np.float32)
        return (values * block_scales[:, :, None]).reshape(np.shape(weight)).astype(np.float32)
    return dequantize(quantize(fmt, weight, block, scale_type))


#: ONNX's FLOAT4E2M1 element type (23); a name from onnx 1.18 on (older onnx: nvfp4 is refused by the settings).
FLOAT4E2M1: int = getattr(onnx.TensorProto, "FLOAT4E2M1", 23)

BLOCK_FORMATS: Mapping[str, BlockFormat] = {
    "int4": BlockFormat("int4", "int4", onnx.TensorProto.INT4, 21, None, (8, 0)),
    "nvfp4": BlockFormat("nvfp4", "float4e2m1", FLOAT4E2M1, 23, NVFP4_BLOCK, (12, 0)),
}
