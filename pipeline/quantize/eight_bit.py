"""The 8-bit formats of the quantize stage (``precision="int8"`` or ``"fp8"``): Q/DQ pairs at the inputs of MatMul,
Gemm, Conv and ConvTranspose, activations per tensor from calibrated ranges (:mod:`pipeline.quantize.calibrate`),
weights per output channel, and the residual Adds TensorRT fuses; then the accuracy search of
:mod:`pipeline.quantize.search` returns the most sensitive ops to the fallback type until the tolerance's bound holds.

On ONNX Runtime's CPU provider the INT8 graph runs with ONNX Runtime's own Q/DQ kernels, and the FP8 graph too: its
CPU provider implements QuantizeLinear/DequantizeLinear for FLOAT8E4M3FN (opset 19+), rounding to nearest even with
saturation exactly as the ONNX spec says, so no emulation is needed for the 8-bit part.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import onnx
import onnx_graphsurgeon as gs

from passes import to_graph
from passes.quantize.formats import QUANTIZED_OPS, QuantFormat
from passes.quantize.placement import Target, plan_targets
from passes.quantize.residual import plan_residuals
from passes.records import Skipped
from pipeline.precision.measure import Feed
from pipeline.quantize.calibrate import calibrate
from pipeline.quantize.format_step import FormatResult, StageInputs, quantization_report
from pipeline.quantize.search import QuantizedGraphs, SearchResult, relative_error
from pipeline.quantize.tolerance import describe, error_bound, output_tolerances
from pipeline.runtime.ort.int8 import record_conv_output_ranges, requantize_conv_outputs
from pipeline.runtime.reports.quantization import QuantizationReport
from pipeline.settings import Settings

logger = logging.getLogger(__name__)


def fallback_tolerances(inputs: StageInputs, fmt: QuantFormat) -> dict[str, tuple[float, float]]:
    """The tolerance the float16 part is judged by: the quantized graph's (the 8-bit error dominates the fp16 one)."""
    planned, _ = plan_targets(inputs.fp32_graph, inputs.settings.keep_fp32)
    layers = len(planned) + len(plan_residuals(inputs.fp32_graph, planned))
    return output_tolerances(inputs.references, fmt, layers)


def quantize_eight_bit(inputs: StageInputs, base: onnx.ModelProto, fmt: QuantFormat, method: str) -> FormatResult:
    """``base`` (the graph after the fallback's precision stage) with Q/DQ pairs at activation ranges calibrated by
    ``method``, searched until its error holds."""
    settings, fp32_model, fp32_graph = inputs.settings, inputs.fp32_model, inputs.fp32_graph
    planned, _ = plan_targets(fp32_graph, settings.keep_fp32)
    residuals = plan_residuals(fp32_graph, planned)
    # ONNX Runtime's session requantizes the float outputs of convolutions before residual Adds (ort_int8 rewrite 0)
    conv_outputs = _residual_conv_outputs(fp32_graph, planned) if fmt.name == "int8" else []
    amax, output_ranges = _calibrated_ranges(
        fp32_model, [*planned, *residuals], conv_outputs, inputs.feeds, fmt, method, settings
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
        inputs.exported.node_metadata,
        [t for t in planned if t.node in names],
        amax,
        fmt,
        measured,
        lambda candidate: relative_error(candidate, measured, inputs.feeds, inputs.references),
    )
    result = graphs.search(settings.precision_search, inputs.feeds)
    final = result.chosen.model
    ops = {t.node: t.op for t in planned}
    searched = [
        Skipped(node, ops.get(node, ""), f"accuracy search: adds relative error {added:.3g}")
        for node, added in result.unquantized
    ]
    report = _report(inputs, final, fmt, method, result, [*skipped, *searched])
    final, report = _requantized_outputs(final, report, output_ranges, measured.ort_int8_conv_outputs)
    layers = len(result.chosen.done)

    def tolerances(largest: Mapping[str, float]) -> dict[str, tuple[float, float]]:
        return output_tolerances(inputs.references, fmt, layers, largest)

    return FormatResult(final, report, tolerances, measured, backend, "quantize", len(graph.nodes))


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

    return select_backend(settings.backend, settings, quiet=True).name


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


def _report(
    inputs: StageInputs,
    final: onnx.ModelProto,
    fmt: QuantFormat,
    method: str,
    result: SearchResult,
    skipped: Sequence[Skipped],
) -> QuantizationReport:
    settings = inputs.settings
    done = result.chosen.done
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
    return quantization_report(
        inputs,
        final,
        fmt,
        method,
        [op for op in done if op.op in QUANTIZED_OPS],
        skipped,
        result.chosen.error,
        notes,
        warnings=tuple(warnings),
        residuals=tuple(op for op in done if op.op not in QUANTIZED_OPS),
        unquantized=tuple(node for node, _ in result.unquantized),
        error_bound=result.chosen.bound,
    )
