"""Stage: quantize. The float32 graph after the passes becomes an explicitly quantized graph in one of four formats:
INT8 or FP8 E4M3 Q/DQ pairs at the inputs of MatMul, Gemm, Conv and ConvTranspose (:mod:`pipeline.quantize.eight_bit`),
or INT4 or NVFP4 block-quantized MatMul/Gemm weights (:mod:`pipeline.quantize.four_bit`). Every other op runs in
float16 (``quantize_fallback="fp16"``, the default: the precision stage's own rewrite, islands and all) or float32.

TensorRT 10+/11 and TensorRT-RTX take these formats only this way (no calibrators, no builder flags): the graph is
the precision. Calibration runs the float32 graph on ONNX Runtime over the calibration inputs (the sample and inputs
drawn like it, or ``convert(calibration=...)``): the 8-bit formats pick each activation's range from them
(:mod:`pipeline.quantize.calibrate`), the 4-bit ones AWQ's scales and NVFP4 activations' ranges.

The flow is one for every format: calibration inputs and PyTorch's outputs on them, the float16 part, the format's
quantization, then the envelope of the final graph's error on ONNX Runtime (calibration and validation inputs), the
per-output tolerances validation holds the backend to (:mod:`pipeline.quantize.tolerance`) and the quantized share's
judgement (:mod:`pipeline.quantize.report`). On ONNX Runtime the float16 part runs as the precision stage's float32
emulation (:func:`pipeline.precision.stage.runnable_model`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch

from converters.errors import ConversionError
from passes import GraphPass, to_graph
from passes.model_io.external_data import check_model
from passes.quantize.blockwise import BLOCK_FORMATS, BlockFormat
from passes.quantize.formats import FORMATS
from passes.records import PassRecord
from pipeline.exporting.stage import ExportedGraph
from pipeline.precision.measure import Feed
from pipeline.precision.stage import calibration_feeds, convert_precision, screened_references
from pipeline.quantize.calibrate import method_for
from pipeline.quantize.eight_bit import fallback_tolerances, quantize_eight_bit
from pipeline.quantize.format_step import QUANT_OPSET, Format, StageInputs
from pipeline.quantize.four_bit import quantize_four_bit, target_settings
from pipeline.quantize.report import judge_cpu_fallback, judge_quantized_share
from pipeline.quantize.search import measure_errors_on
from pipeline.runtime.io_spec import normalise_sample
from pipeline.runtime.reports.precision import PrecisionReport
from pipeline.runtime.reports.quantization import QuantizationReport
from pipeline.settings import Settings, Tolerance
from pipeline.validation.stage import validation_feeds

logger = logging.getLogger(__name__)

QUANTIZED_PRECISIONS = (*FORMATS, *BLOCK_FORMATS)
#: How the accuracy report labels an output judged by the tolerance the quantize stage derived.
DERIVED_TOLERANCE = "tolerance derived from the quantization (report.quantization.tolerances)"

__all__ = [
    "DERIVED_TOLERANCE",
    "QUANTIZED_PRECISIONS",
    "QUANT_OPSET",
    "is_quantized",
    "measured_envelope",
    "quantize_precision",
    "quantize_settings",
    "quantized_validation_settings",
]


def is_quantized(settings: Settings) -> bool:
    """Does ``settings.precision`` ask for an explicitly quantized graph (INT8, FP8, INT4 or NVFP4)?"""
    return settings.precision in QUANTIZED_PRECISIONS


def quantize_settings(settings: Settings) -> Settings:
    """Quantized graphs export at :data:`QUANT_OPSET` unless an opset was given; the 4-bit formats choose TensorRT
    targets from the precision (:func:`pipeline.quantize.four_bit.target_settings`)."""
    if not is_quantized(settings):
        return settings
    if settings.opset is None:
        settings = dataclasses.replace(settings, opset=QUANT_OPSET)
    fmt = _format(settings)
    return target_settings(settings, fmt) if isinstance(fmt, BlockFormat) else settings


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
    fmt = _format(settings)
    method = method_for(settings.calibration_method, fmt)
    feeds = list(calibration_feeds(exported.io, sample, calibration, settings))
    given = len(feeds) if calibration is not None else 1
    feeds, references = screened_references(model, exported.io, feeds, given)
    inputs = StageInputs(fp32_model, to_graph(fp32_model)[0], exported, feeds, references, settings)
    records: list[PassRecord] = []
    precision = None
    base = fp32_model
    if settings.quantize_fallback == "fp16":
        # the float16 part is judged by the quantized graph's tolerance where the format derives one before it
        # quantizes (the 8-bit error dominates the fp16 one); islands come from the rules and measured overflow, not
        # from an accuracy search
        derived = {} if isinstance(fmt, BlockFormat) else fallback_tolerances(inputs, fmt)
        judged = {name: Tolerance(*pair, source=DERIVED_TOLERANCE) for name, pair in derived.items()}
        half = dataclasses.replace(
            settings,
            precision="fp16",
            precision_search=False,
            calibration_method="auto",
            nvfp4_activations=False,
            quantize_embeddings=False,
            tolerances={**judged, **settings.tolerances},
        )
        base, records, precision = convert_precision(
            fp32_model, exported, model, sample, calibration, half, passes, (feeds, references)
        )
    start = time.perf_counter()
    if isinstance(fmt, BlockFormat):
        result = quantize_four_bit(inputs, base, fmt, method)
    else:
        result = quantize_eight_bit(inputs, base, fmt, method)
    final = result.model
    _check_valid(final, fmt)
    seconds = time.perf_counter() - start
    records.append(PassRecord(result.record, 0, seconds, result.nodes_before, len(final.graph.node), True))
    largest = measured_envelope(final, exported, model, sample, result.measured, feeds, references, result.feed_errors)
    report = dataclasses.replace(result.report, tolerances=result.tolerances(largest))
    report = judge_quantized_share(report, settings)
    if method == "awq" and calibration is None:
        report = _warn_awq_on_drawn_inputs(report, settings)
    return final, records, precision, judge_cpu_fallback(report, settings, result.backend)


def _warn_awq_on_drawn_inputs(report: QuantizationReport, settings: Settings) -> QuantizationReport:
    """AWQ weighs each input channel by its activations: fitted on inputs drawn at random, its scales say little
    about real data. A loud warning, in the log and the report, never silence."""
    message = (
        f"calibration_method='awq' fitted its activation-aware scales on random inputs (the sample and "
        f"{settings.calibration_inputs} drawn like it): no calibration= was given, so the scales reflect the drawn "
        "activations, not your data's; fix: pass calibration=[...] with real samples (a few batches of real data)"
    )
    logger.warning("%s", message)
    return dataclasses.replace(report, warnings=(*report.warnings, message))


def _format(settings: Settings) -> Format:
    return BLOCK_FORMATS[settings.precision] if settings.precision in BLOCK_FORMATS else FORMATS[settings.precision]


def measured_envelope(
    final: onnx.ModelProto,
    exported: ExportedGraph,
    model: torch.nn.Module,
    sample: Any,
    settings: Settings,
    feeds: Sequence[Feed],
    references: Sequence[dict[str, np.ndarray]],
    on_feeds: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Each float output's largest absolute error, as ONNX Runtime runs the quantized graph, on the calibration
    inputs (``on_feeds`` when the format measured them already) and on the validation inputs (drawn like the sample,
    they may leave the calibrated ranges and clip): the envelope validation then holds the backend to
    (:mod:`pipeline.quantize.tolerance`). Validation inputs among the calibration inputs (all of them when the
    conversion validates: :func:`~pipeline.precision.stage.calibration_feeds`) are not run again; one session measures
    the rest."""
    checks = validation_feeds(exported.io, exported.io.flatten_call(*normalise_sample(sample)), settings)
    new = [check for check in checks if not any(_same_feed(check, feed) for feed in feeds)]
    sets: list[tuple[Sequence[Feed], Sequence[dict[str, np.ndarray]]]] = []
    if new:
        given = 1 if new[0] is checks[0] else 0  # the sample itself: PyTorch must take it
        # (draws PyTorch refuses are dropped; the calibration's screening dropped the same ones, the rest are measured)
        taken = screened_references(model, exported.io, new, given, "validation", required=False)
        if taken[0]:
            sets.append(taken)
    if on_feeds is None:
        sets.append((feeds, references))
    measured = [largest for _, largest in measure_errors_on(final, settings, sets)] if sets else []
    if on_feeds is None:
        on_feeds = measured.pop()
    envelope = dict(on_feeds)
    for on_checks in measured:
        envelope.update({name: max(envelope.get(name, 0.0), value) for name, value in on_checks.items()})
    return envelope


def _same_feed(a: Feed, b: Feed) -> bool:
    """The same inputs: the same names, shapes, types and values."""
    return a.keys() == b.keys() and all(
        a[name].shape == b[name].shape and a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name])
        for name in a
    )


def _check_valid(model: onnx.ModelProto, fmt: Format) -> None:
    try:
        check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ConversionError(
            f"stage quantize: the {fmt.name} graph is not valid ONNX: {exc}",
            fix="convert with precision='fp32' to confirm, and report the model that triggers it",
        ) from exc
