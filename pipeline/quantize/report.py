"""What the quantize stage reports (``module.report.quantization``, saved in the artifact's metadata): the format,
the calibration method, every quantized op with its activation range and scale and its weight's scales, the ops left
in float with reasons, the share of MatMul/Gemm/Conv FLOPs and of their weights that is quantized, and the output
error on the calibration inputs.
"""

from __future__ import annotations

import dataclasses
import logging

from converters.errors import ConversionError
from pipeline.runtime.reports.quantization import QuantizationReport
from pipeline.settings import Settings

logger = logging.getLogger(__name__)


def judge_quantized_share(report: QuantizationReport, settings: Settings) -> QuantizationReport:
    """No silent degradation: little of the MatMul/Gemm/Conv compute quantized is a loud warning (an error with
    ``precision_strict``), with the heaviest reasons."""
    if report.share >= settings.precision_min_share:
        return report
    reasons = sorted({f"{s.op} {s.node}: {s.reason}" for s in report.skipped})[:5]
    message = (
        f"precision={report.precision!r} was asked, but only {report.share:.1%} of MatMul/Gemm/Conv FLOPs are "
        f"quantized (precision_min_share={settings.precision_min_share:g}); the rest runs in {report.fallback}. "
        f"Skipped: {'; '.join(reasons) or 'none'}"
    )
    if settings.precision_strict:
        raise ConversionError(
            f"stage quantize: {message}",
            fix="drop keep_fp32 entries, or lower precision_min_share; precision_strict=False makes this a warning",
        )
    logger.warning("%s", message)
    return dataclasses.replace(report, warnings=(*report.warnings, message))


def judge_cpu_fallback(report: QuantizationReport, settings: Settings, backend: str) -> QuantizationReport:
    """INT8 with the fp16 fallback on ONNX Runtime's CPU provider is slower than fp32, never silently: a loud warning
    with the fix. The CPU provider has no fp16 kernels, so the fp16 part runs as its float32 emulation with a rounding
    per tensor (exact, as TensorRT would compute it, and about 2x slower than fp32 on the bundled CNN; see the README's
    INT8 section and ``benchmarks/bench_quantize.py``). fp16 stays the default: it is what TensorRT runs fastest, and
    the emulation is what validates the artifact TensorRT will build."""
    cpu_only = set(settings.ort_providers) <= {"CPUExecutionProvider"}
    if report.precision != "int8" or report.fallback != "fp16" or backend != "onnxruntime" or not cpu_only:
        return report
    message = (
        "precision='int8' with quantize_fallback='fp16' runs on ONNX Runtime's CPU provider, which has no fp16 "
        "kernels: the unquantized ops run as the exact float32 emulation of fp16, slower than the fp32 module. "
        "Pass quantize_fallback='fp32' (CLI: --quantize-fallback fp32) for INT8 speed on the CPU (keep 'fp16' for a "
        "TensorRT engine)"
    )
    logger.warning("%s", message)
    return dataclasses.replace(report, warnings=(*report.warnings, message))
