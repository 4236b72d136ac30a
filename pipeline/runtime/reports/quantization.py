"""The quantize stage's record (``module.report.quantization``, saved in the artifact's metadata): the format, the
calibration method, every quantized op with its activation range and scale and its weight's scales, the ops left in
float with reasons, the quantized share of MatMul/Gemm/Conv FLOPs and weights, and the output error on the
calibration inputs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from passes.records import QuantizedOp, Skipped


@dataclass(frozen=True)
class QuantizationReport:
    """What the quantize stage did; ``module.report.quantization``."""

    precision: str  # "int8" | "fp8" | "int4" | "nvfp4"
    dtype: str  # "int8" | "float8e4m3fn" | "int4" | "float4e2m1"
    fallback: str  # the type of the unquantized ops: "fp16" | "fp32"
    method: str  # the calibration method used ("max" or "awq" for the 4-bit weights)
    opset: int
    quantized: tuple[QuantizedOp, ...]
    skipped: tuple[Skipped, ...]
    quantized_flops: float
    total_flops: float
    quantized_weights: int  # weight elements stored in the 8-bit type
    total_weights: int  # weight elements of all MatMul/Gemm/Conv/ConvTranspose constants
    calibration_inputs: int
    relative_error: float  # ||got - PyTorch|| / ||PyTorch|| over the calibration inputs, worst output
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    tolerances: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)  # output -> (atol, rtol)
    residuals: tuple[QuantizedOp, ...] = ()  # residual Add inputs quantized so TensorRT fuses the Add (op "Add")
    unquantized: tuple[str, ...] = ()  # ops the accuracy search returned to the fallback type, most sensitive first
    error_bound: float = 0.0  # the largest relative_error accepted (pipeline.quantize.tolerance)
    # tensor -> calibrated amax of a convolution output before a residual Add, which ONNX Runtime's session
    # requantizes (pipeline.runtime.ort.int8, rewrite 0); module.onnx's metadata holds them too
    ort_conv_output_ranges: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def share(self) -> float:
        """The FLOP-weighted share of MatMul/Gemm/Conv quantized (1.0 for a graph without them)."""
        return self.quantized_flops / self.total_flops if self.total_flops else 1.0

    @property
    def weight_share(self) -> float:
        """The share of MatMul/Gemm/Conv constant weight elements stored quantized (8 or 4 bits; 1.0 when there are
        none)."""
        return self.quantized_weights / self.total_weights if self.total_weights else 1.0

    @property
    def bits(self) -> int:
        """The width of the quantized weights: 4 (int4, nvfp4) or 8."""
        return 4 if self.precision in ("int4", "nvfp4") else 8

    def scales(self) -> dict[str, float]:
        """The activation scale of every quantized tensor, by tensor name."""
        return {op.activation: op.activation_scale for op in (*self.quantized, *self.residuals)}

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (what the artifact's metadata holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantizationReport:
        """The report back from :meth:`to_dict`'s data."""
        values = dict(data)
        values["quantized"] = tuple(QuantizedOp(**q) for q in values["quantized"])
        values["residuals"] = tuple(QuantizedOp(**q) for q in values.get("residuals", ()))
        values["skipped"] = tuple(Skipped(**s) for s in values["skipped"])
        values["notes"] = tuple(values.get("notes", ()))
        values["warnings"] = tuple(values.get("warnings", ()))
        values["unquantized"] = tuple(values.get("unquantized", ()))
        values["tolerances"] = {k: (float(a), float(r)) for k, (a, r) in values.get("tolerances", {}).items()}
        values["ort_conv_output_ranges"] = {k: float(v) for k, v in values.get("ort_conv_output_ranges", {}).items()}
        return cls(**values)

    def summary_lines(self, limit: int = 8) -> list[str]:
        """The lines ``module.report.summary()`` prints for the quantize stage (at most ``limit`` skipped ops)."""
        lines = [
            f"quantize  {self.precision} ({self.dtype}, calibration {self.method} on {self.calibration_inputs} "
            f"inputs, opset {self.opset}): {len(self.quantized)} ops quantized (and {len(self.residuals)} residual Add "
            f"inputs), {len(self.skipped)} left in "
            f"{self.fallback}; {self.share:.1%} of MatMul/Gemm/Conv FLOPs and {self.weight_share:.1%} of their "
            f"weights in {self.bits} bits; output error {self.relative_error:.3g} (relative L2 vs PyTorch fp32)"
        ]
        for skipped in self.skipped[:limit]:
            lines.append(f"          float {skipped.op:<14} {skipped.node}: {skipped.reason}")
        if len(self.skipped) > limit:
            lines.append(f"          ... {len(self.skipped) - limit} more in report.quantization.skipped")
        lines.extend(f"          {note}" for note in self.notes)
        lines.extend(f"          WARNING {warning}" for warning in self.warnings)
        return lines
