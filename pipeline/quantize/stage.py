"""Stage: quantize. The float32 graph after the passes becomes an explicitly quantized graph (INT8 or FP8 E4M3):
Q/DQ pairs at the inputs of MatMul, Gemm, Conv and ConvTranspose, weights stored in 8 bits, every other op in
float16 (``quantize_fallback="fp16"``, the default: the precision stage's own rewrite, islands and all) or float32.

TensorRT 10+/11 and TensorRT-RTX take INT8 and FP8 only this way (no calibrators, no builder flags): the graph is
the precision. Calibration runs the float32 graph on ONNX Runtime over the calibration inputs (the sample and inputs
drawn like it, or ``convert(calibration=...)``) and picks each activation's range (:mod:`pipeline.quantize.calibrate`).

On ONNX Runtime's CPU provider the INT8 graph runs with ONNX Runtime's own Q/DQ kernels, and the FP8 graph too: its
CPU provider implements QuantizeLinear/DequantizeLinear for FLOAT8E4M3FN (opset 19+), rounding to nearest even with
saturation exactly as the ONNX spec says, so no emulation is needed for the 8-bit part; the float16 part runs as the
precision stage's float32 emulation (:func:`pipeline.precision.stage.runnable_model`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from converters.errors import ConversionError
from converters.settings import Settings, Tolerance
from passes import GraphPass, PassRecord, to_graph, to_model
from passes.model_io.external_data import check_model, ort_session_bytes
from passes.precision.types import LOW_TYPES
from passes.quantize.formats import FORMATS, QuantFormat
from passes.quantize.insert import quantize_graph
from passes.quantize.placement import QUANTIZED_OPS, Skipped, Target, plan_targets
from passes.quantize.residual import plan_residuals
from pipeline.export import ExportedGraph
from pipeline.precision.measure import Feed, session_feed
from pipeline.precision.report import PrecisionReport
from pipeline.precision.share import compute_share
from pipeline.precision.stage import calibration_feeds, convert_precision, runnable_model, torch_references
from pipeline.quantize.calibrate import calibrate, method_for
from pipeline.quantize.report import QuantizationReport, judge_quantized_share

logger = logging.getLogger(__name__)

QUANTIZED_PRECISIONS = tuple(FORMATS)
#: The opset quantized graphs export at (unless ``opset`` is given): float8 and float16 scales need 19, and
#: TensorRT-RTX's INT8/FP8 Q/DQ support was verified at 21.
QUANT_OPSET = 21
#: Validation of a quantized graph's float outputs (unless the user gives ``tolerances`` for the output or for
#: "float32"): atol is this fraction of the output's largest |value| in PyTorch fp32 on the calibration inputs, rtol
#: the same fraction: a coarse check that catches broken graphs (wrong scales, a mis-fused Q/DQ: 50% errors), not a
#: measure of accuracy. 8-bit activations carry ~0.5-2% error of their range per layer, more on inputs unlike the
#: calibration data (validation inputs are random, drawn like the sample); judge accuracy on your task's metric.
QUANT_TOLERANCE_FRACTION = 0.2


def is_quantized(settings: Settings) -> bool:
    """Does ``settings.precision`` ask for an explicitly quantized graph (INT8 or FP8)?"""
    return settings.precision in QUANTIZED_PRECISIONS


def quantize_settings(settings: Settings) -> Settings:
    """Quantized graphs export at :data:`QUANT_OPSET` unless an opset was given."""
    if is_quantized(settings) and settings.opset is None:
        return dataclasses.replace(settings, opset=QUANT_OPSET)
    return settings


def quantized_validation_settings(settings: Settings, report: QuantizationReport | None) -> Settings:
    """Float outputs of a quantized graph are judged by the report's per-output tolerances (see
    :data:`QUANT_TOLERANCE_FRACTION`), unless the user gave one for the output or for "float32"."""
    if report is None or "float32" in settings.tolerances:
        return settings
    derived = {
        name: Tolerance(atol, rtol)
        for name, (atol, rtol) in report.tolerances.items()
        if name not in settings.tolerances
    }
    return dataclasses.replace(settings, tolerances={**settings.tolerances, **derived})


def output_tolerances(references: Sequence[Mapping[str, np.ndarray]]) -> dict[str, tuple[float, float]]:
    """Per float output: (atol, rtol) = :data:`QUANT_TOLERANCE_FRACTION` x (its largest |value|, 1)."""
    peaks: dict[str, float] = {}
    for outputs in references:
        for name, value in outputs.items():
            array = np.asarray(value)
            if np.issubdtype(array.dtype, np.floating) and array.size:
                peaks[name] = max(peaks.get(name, 0.0), float(np.nanmax(np.abs(array))))
    fraction = QUANT_TOLERANCE_FRACTION
    return {name: (max(fraction * peak, 1e-6), fraction) for name, peak in peaks.items()}


def quantize_precision(
    fp32_model: onnx.ModelProto,
    exported: ExportedGraph,
    model: torch.nn.Module,
    sample: Any,
    calibration: Iterable[Any] | None,
    settings: Settings,
    passes: Sequence[GraphPass] = (),
) -> tuple[onnx.ModelProto, list[PassRecord], PrecisionReport | None, QuantizationReport]:
    """The float32 graph after the passes -> the quantized final graph, pass records, the precision report of the
    float16 part (None with ``quantize_fallback="fp32"``) and the quantization report."""
    fmt = FORMATS[settings.precision]
    method = method_for(settings.calibration_method, fmt)
    feeds = list(calibration_feeds(exported.io, sample, calibration, settings))
    records: list[PassRecord] = []
    precision = None
    base = fp32_model
    references = torch_references(model, exported.io, feeds)
    tolerances = output_tolerances(references)
    if settings.quantize_fallback == "fp16":
        # the float16 part is judged by the quantized graph's tolerance (the 8-bit error dominates the fp16 one);
        # islands come from the rules and measured overflow, not from an accuracy search
        judged = {name: Tolerance(*pair) for name, pair in tolerances.items()}
        half = dataclasses.replace(
            settings, precision="fp16", precision_search=False, tolerances={**judged, **settings.tolerances}
        )
        base, records, precision = convert_precision(fp32_model, exported, model, sample, calibration, half, passes)
    start = time.perf_counter()
    fp32_graph = to_graph(fp32_model)[0]
    fp32_targets, _ = plan_targets(fp32_graph, settings.keep_fp32)
    residuals = plan_residuals(fp32_graph, fp32_targets)
    inputs = _activation_tensors(fp32_model, [*fp32_targets, *residuals])
    amax_by_tensor = calibrate(
        fp32_model,
        feeds,
        sorted(set(inputs.values())),
        fmt,
        method,
        settings.calibration_percentile,
        settings.ort_providers,
    )
    graph, metadata = to_graph(base)
    targets, skipped = plan_targets(graph, settings.keep_fp32)
    targets = [t for t in targets if t.node in inputs]
    present = {n.name for n in graph.nodes}
    targets += [r for r in residuals if r.node in present]
    before = len(graph.nodes)
    done = quantize_graph(graph, fmt, targets, {node: amax_by_tensor[t] for node, t in inputs.items()})
    final = to_model(graph, base, {**exported.node_metadata, **metadata})
    _check_valid(final, fmt)
    records.append(PassRecord("quantize", 0, time.perf_counter() - start, before, len(final.graph.node), True))
    error = _relative_error(final, settings, feeds, references)
    report = _report(fp32_model, final, settings, fmt, method, done, skipped, len(feeds), error)
    report = dataclasses.replace(report, tolerances=tolerances)
    return final, records, precision, judge_quantized_share(report, settings)


def _activation_tensors(model: onnx.ModelProto, targets: Sequence[Target]) -> dict[str, str]:
    """Node name -> the float32 tensor its quantized activation input reads, in ``model``."""
    nodes = {n.name: n for n in model.graph.node}
    return {t.node: nodes[t.node].input[t.activation] for t in targets if t.node in nodes}


def _check_valid(model: onnx.ModelProto, fmt: QuantFormat) -> None:
    try:
        check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ConversionError(
            f"stage quantize: the {fmt.name} graph is not valid ONNX: {exc}",
            fix="convert with precision='fp32' to confirm, and report the model that triggers it",
        ) from exc


def _relative_error(
    final: onnx.ModelProto, settings: Settings, feeds: Sequence[Feed], references: Sequence[dict[str, np.ndarray]]
) -> float:
    """The worst ``||got - want|| / ||want||`` over float outputs and calibration inputs, on ONNX Runtime."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    runnable = runnable_model(final, "onnxruntime", settings)
    session = ort.InferenceSession(
        ort_session_bytes(runnable, options), sess_options=options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    worst = 0.0
    for feed, want in zip(feeds, references, strict=True):
        got = dict(zip(names, session.run(names, session_feed(session, feed)), strict=True))
        for name in names:
            a, b = np.asarray(got[name], np.float64), np.asarray(want[name], np.float64)
            if a.dtype.kind != "f" or not np.issubdtype(np.asarray(want[name]).dtype, np.floating):
                continue
            norm = float(np.linalg.norm(b))
            worst = max(worst, float(np.linalg.norm(a - b)) / (norm if norm > 0 else 1.0))
    return worst


def _report(
    fp32_model: onnx.ModelProto,
    final: onnx.ModelProto,
    settings: Settings,
    fmt: QuantFormat,
    method: str,
    done: Sequence[Any],
    skipped: Sequence[Skipped],
    calibration_inputs: int,
    error: float,
) -> QuantizationReport:
    # every heavy node of the float32 graph counts as "not fp16" there: its FLOPs by node, from the shared counter
    flops = compute_share(fp32_model, LOW_TYPES["fp16"], {d.name: d.opt for d in settings.dynamic}).fp32_flops
    weighted = [op for op in done if op.op in QUANTIZED_OPS]
    quantized = {op.node for op in weighted}
    weights = _weight_elements(fp32_model)
    opset = next((o.version for o in final.opset_import if o.domain in ("", "ai.onnx")), 0)
    notes = [
        f"activations per tensor, weights per output channel, symmetric; zero points 0; unquantized ops in "
        f"{settings.quantize_fallback}",
        f"float outputs are validated against PyTorch fp32 with atol = {QUANT_TOLERANCE_FRACTION:g} x the output's "
        f"largest |value| on the calibration inputs and rtol {QUANT_TOLERANCE_FRACTION:g} (report.quantization."
        "tolerances), unless tolerances= names the output or 'float32'",
    ]
    if fmt.name == "fp8":
        notes.append("FP8 engines need compute capability >= 8.9 (Ada, Hopper, Blackwell)")
    return QuantizationReport(
        precision=fmt.name,
        dtype=fmt.dtype_name,
        fallback=settings.quantize_fallback,
        method=method,
        opset=int(opset),
        quantized=tuple(weighted),
        residuals=tuple(op for op in done if op.op not in QUANTIZED_OPS),
        skipped=tuple(skipped),
        quantized_flops=sum(f for n, f in flops.items() if n in quantized),
        total_flops=sum(flops.values()),
        quantized_weights=sum(w for n, w in weights.items() if n in quantized),
        total_weights=sum(weights.values()),
        calibration_inputs=calibration_inputs,
        relative_error=error,
        notes=tuple(notes),
    )


def _weight_elements(model: onnx.ModelProto) -> dict[str, int]:
    """Node -> elements of its constant weight (input 1), for every MatMul/Gemm/Conv/ConvTranspose that has one."""
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    heavy = ("MatMul", "Gemm", "Conv", "ConvTranspose")
    weighted = [n for n in model.graph.node if n.op_type in heavy and len(n.input) > 1 and n.input[1] in sizes]
    return {n.name: sizes[n.input[1]] for n in weighted}
