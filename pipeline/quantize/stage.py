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
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.errors import ConversionError
from passes import GraphPass, to_graph
from passes.model_io.external_data import check_model
from passes.precision.types import LOW_TYPES
from passes.quantize.formats import FORMATS, QUANTIZED_OPS, QuantFormat
from passes.quantize.placement import Target, plan_targets
from passes.quantize.residual import plan_residuals
from passes.records import PassRecord, Skipped
from pipeline.exporting.stage import ExportedGraph
from pipeline.precision.measure import Feed
from pipeline.precision.share import compute_share
from pipeline.precision.stage import calibration_feeds, convert_precision, screened_references
from pipeline.quantize.calibrate import calibrate, method_for
from pipeline.quantize.report import judge_cpu_fallback, judge_quantized_share
from pipeline.quantize.search import QuantizedGraphs, SearchResult, measure_errors, relative_error
from pipeline.quantize.tolerance import describe, error_bound, output_tolerances
from pipeline.runtime.io_spec import normalise_sample
from pipeline.runtime.ort.int8 import record_conv_output_ranges, requantize_conv_outputs
from pipeline.runtime.reports.precision import PrecisionReport
from pipeline.runtime.reports.quantization import QuantizationReport
from pipeline.settings import Settings, Tolerance
from pipeline.validation.stage import validation_feeds

logger = logging.getLogger(__name__)

QUANTIZED_PRECISIONS = tuple(FORMATS)
#: The opset quantized graphs export at (unless ``opset`` is given): float8 and float16 scales need 19, and
#: TensorRT-RTX's INT8/FP8 Q/DQ support was verified at 21.
QUANT_OPSET = 21
#: How the accuracy report labels an output judged by the tolerance the quantize stage derived.
DERIVED_TOLERANCE = "tolerance derived from the quantization (report.quantization.tolerances)"


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
    :mod:`pipeline.quantize.tolerance`), unless the user gave one for the output or for "float32"."""
    if report is None or "float32" in settings.tolerances:
        return settings
    derived = {
        name: Tolerance(atol, rtol, source=DERIVED_TOLERANCE)
        for name, (atol, rtol) in report.tolerances.items()
        if name not in settings.tolerances
    }
    return dataclasses.replace(settings, tolerances={**settings.tolerances, **derived})


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
    given = len(feeds) if calibration is not None else 1
    feeds, references = screened_references(model, exported.io, feeds, given)
    records: list[PassRecord] = []
    precision = None
    base = fp32_model
    fp32_graph = to_graph(fp32_model)[0]
    planned, _ = plan_targets(fp32_graph, settings.keep_fp32)
    residuals = plan_residuals(fp32_graph, planned)
    layers = len(planned) + len(residuals)
    tolerances = output_tolerances(references, fmt, layers)
    if settings.quantize_fallback == "fp16":
        # the float16 part is judged by the quantized graph's tolerance (the 8-bit error dominates the fp16 one);
        # islands come from the rules and measured overflow, not from an accuracy search
        judged = {name: Tolerance(*pair, source=DERIVED_TOLERANCE) for name, pair in tolerances.items()}
        half = dataclasses.replace(
            settings, precision="fp16", precision_search=False, tolerances={**judged, **settings.tolerances}
        )
        base, records, precision = convert_precision(
            fp32_model, exported, model, sample, calibration, half, passes, (feeds, references)
        )
    start = time.perf_counter()
    # ONNX Runtime's session requantizes the float outputs of convolutions before residual Adds (ort_int8 rewrite 0)
    conv_outputs = _residual_conv_outputs(fp32_graph, planned) if fmt.name == "int8" else []
    amax, output_ranges = _calibrated_ranges(
        fp32_model, [*planned, *residuals], conv_outputs, feeds, fmt, method, settings
    )
    base = record_conv_output_ranges(base, output_ranges)
    # the search and the tolerance measure the graph the backend runs: on ONNX Runtime its session graph, for TensorRT
    # the Q/DQ graph as written
    backend = _backend_name(settings)
    measured = settings if backend == "onnxruntime" else dataclasses.replace(settings, ort_int8_conv_outputs="exact")
    graph = to_graph(base)[0]
    in_base, skipped = plan_targets(graph, settings.keep_fp32)
    names = {t.node for t in in_base}
    graphs = QuantizedGraphs(
        fp32_model,
        base,
        exported.node_metadata,
        [t for t in planned if t.node in names],
        amax,
        fmt,
        measured,
        lambda candidate: relative_error(candidate, measured, feeds, references),
    )
    result = graphs.search(settings.precision_search, feeds)
    final = result.chosen.model
    _check_valid(final, fmt)
    records.append(
        PassRecord("quantize", 0, time.perf_counter() - start, len(graph.nodes), len(final.graph.node), True)
    )
    ops = {t.node: t.op for t in planned}
    searched = [
        Skipped(node, ops.get(node, ""), f"accuracy search: adds relative error {added:.3g}")
        for node, added in result.unquantized
    ]
    report = _report(fp32_model, final, settings, fmt, method, result, [*skipped, *searched], len(feeds))
    final, report = _requantized_outputs(final, report, output_ranges, measured.ort_int8_conv_outputs)
    layers = len(result.chosen.done)
    largest = measured_envelope(final, exported, model, sample, measured, feeds, references)
    tolerances = output_tolerances(references, fmt, layers, largest)
    report = judge_quantized_share(dataclasses.replace(report, tolerances=tolerances), settings)
    return final, records, precision, judge_cpu_fallback(report, settings, backend)


def _residual_conv_outputs(fp32_graph: gs.Graph, targets: Sequence[Target]) -> list[str]:
    """The float32 outputs of the planned convolutions that are read by Adds only (TensorRT fuses the residual Add
    and keeps them float; ONNX Runtime's session requantizes them: :mod:`pipeline.runtime.ort.int8`, rewrite 0)."""
    planned = {t.node for t in targets if t.op == "Conv"}
    return [
        node.outputs[0].name
        for node in fp32_graph.nodes
        if node.name in planned
        and node.outputs[0].outputs
        and all(reader.op == "Add" for reader in node.outputs[0].outputs)
    ]


def _requantized_outputs(
    final: onnx.ModelProto, report: QuantizationReport, ranges: dict[str, float], mode: str
) -> tuple[onnx.ModelProto, QuantizationReport]:
    """The final graph recording the ranges of the convolution outputs ONNX Runtime's session requantizes (those
    that still feed residual Adds after the search), the report with them and, when ``mode`` requantizes, a note that
    says so (it is one rounding more than TensorRT computes)."""
    used = {name: ranges[name] for name in requantize_conv_outputs(to_graph(final)[0], ranges)}
    final = record_conv_output_ranges(final, used)
    report = dataclasses.replace(report, ort_conv_output_ranges=used)
    if mode != "requantize" or not used:
        return final, report
    note = (
        f"ONNX Runtime's session requantizes the float outputs of {len(used)} convolutions before residual Adds to "
        "INT8 (QLinearConv + QLinearAdd; ranges in report.quantization.ort_conv_output_ranges): one 8-bit rounding "
        "more than TensorRT's fused kernels, which module.onnx keeps; ort_int8_conv_outputs='exact' keeps them float "
        "(slower)"
    )
    return final, dataclasses.replace(report, notes=(*report.notes, note))


def _backend_name(settings: Settings) -> str:
    """The backend that will run the graph, when it is known without building anything ("onnxruntime" for
    ``backend="auto"`` where TensorRT cannot run), else the requested name."""
    if settings.backend not in ("auto", "onnxruntime"):
        return settings.backend
    from pipeline.runtime.executors import select_backend

    return select_backend(settings.backend, settings).name


def measured_envelope(
    final: onnx.ModelProto,
    exported: ExportedGraph,
    model: torch.nn.Module,
    sample: Any,
    settings: Settings,
    feeds: Sequence[Feed],
    references: Sequence[dict[str, np.ndarray]],
) -> dict[str, float]:
    """Each float output's largest absolute error, as ONNX Runtime runs the quantized graph, on the calibration
    inputs and on the validation inputs (drawn like the sample, they may leave the calibrated ranges and clip):
    the envelope validation then holds the backend to (:mod:`pipeline.quantize.tolerance`)."""
    checks = validation_feeds(exported.io, exported.io.flatten_call(*normalise_sample(sample)), settings)
    checks, check_references = screened_references(model, exported.io, checks, 1, "validation")
    on_checks = measure_errors(final, settings, checks, check_references)[1]
    on_feeds = measure_errors(final, settings, feeds, references)[1]
    return {name: max(on_feeds.get(name, 0.0), value) for name, value in on_checks.items()}


def _calibrated_ranges(
    fp32_model: onnx.ModelProto,
    targets: Sequence[Target],
    tensors: Sequence[str],
    feeds: Sequence[Feed],
    fmt: QuantFormat,
    method: str,
    settings: Settings,
) -> tuple[dict[str, float], dict[str, float]]:
    """Node name -> the calibrated range (amax) of the activation each target quantizes, and tensor name -> the
    calibrated range of each of ``tensors`` (one calibration run for both)."""
    inputs = _activation_tensors(fp32_model, targets)
    by_tensor = calibrate(
        fp32_model,
        feeds,
        sorted(set(inputs.values()) | set(tensors)),
        fmt,
        method,
        settings.calibration_percentile,
        settings.ort_providers,
    )
    return {node: by_tensor[tensor] for node, tensor in inputs.items()}, {t: by_tensor[t] for t in tensors}


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


def _report(
    fp32_model: onnx.ModelProto,
    final: onnx.ModelProto,
    settings: Settings,
    fmt: QuantFormat,
    method: str,
    result: SearchResult,
    skipped: Sequence[Skipped],
    calibration_inputs: int,
) -> QuantizationReport:
    # every heavy node of the float32 graph counts as "not fp16" there: its FLOPs by node, from the shared counter
    flops = compute_share(fp32_model, LOW_TYPES["fp16"], {d.name: d.opt for d in settings.dynamic}).fp32_flops
    done = result.chosen.done
    weighted = [op for op in done if op.op in QUANTIZED_OPS]
    quantized = {op.node for op in weighted}
    weights = _weight_elements(fp32_model)
    opset = next((o.version for o in final.opset_import if o.domain in ("", "ai.onnx")), 0)
    notes = [
        f"activations per tensor, weights per output channel, symmetric; zero points 0; unquantized ops in "
        f"{settings.quantize_fallback}",
        describe(fmt, len(done)),
    ]
    if result.unquantized:
        names = ", ".join(node for node, _ in result.unquantized)
        notes.append(
            f"accuracy search: relative error {result.first_error:.3g} with every op quantized exceeded "
            f"{error_bound(fmt, len(done) + len(result.unquantized)):.3g}; {len(result.unquantized)} most sensitive "
            f"ops returned to {settings.quantize_fallback}: {names}"
        )
    warnings = []
    if not result.chosen.passed:
        logger.warning(
            "stage quantize: %s output error %.3g exceeds the quantization bound %.3g",
            fmt.name,
            result.chosen.error,
            result.chosen.bound,
        )
        warnings.append(
            f"output error {result.chosen.error:.3g} exceeds the quantization bound {result.chosen.bound:.3g}"
            + ("" if settings.precision_search else " (precision_search=False: no ops were un-quantized)")
        )
    if fmt.name == "fp8":
        notes.append("FP8 engines need compute capability >= 8.9 (Ada, Hopper, Blackwell)")
    return QuantizationReport(
        precision=fmt.name,
        dtype=fmt.dtype_name,
        fallback=settings.quantize_fallback,
        method=method,
        opset=int(opset),
        quantized=tuple(weighted),
        skipped=tuple(skipped),
        quantized_flops=sum(f for n, f in flops.items() if n in quantized),
        total_flops=sum(flops.values()),
        quantized_weights=sum(w for n, w in weights.items() if n in quantized),
        total_weights=sum(weights.values()),
        calibration_inputs=calibration_inputs,
        relative_error=result.chosen.error,
        notes=tuple(notes),
        warnings=tuple(warnings),
        residuals=tuple(op for op in done if op.op not in QUANTIZED_OPS),
        unquantized=tuple(node for node, _ in result.unquantized),
        error_bound=result.chosen.bound,
    )


def _weight_elements(model: onnx.ModelProto) -> dict[str, int]:
    """Node -> elements of its constant weight (input 1), for every MatMul/Gemm/Conv/ConvTranspose that has one."""
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    heavy = ("MatMul", "Gemm", "Conv", "ConvTranspose")
    weighted = [n for n in model.graph.node if n.op_type in heavy and len(n.input) > 1 and n.input[1] in sizes]
    return {n.name: sizes[n.input[1]] for n in weighted}
