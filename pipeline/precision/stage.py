"""Stage: precision. The float32 graph after the passes becomes float16 or bfloat16 with float32 islands.

The pass (:class:`passes.precision.convert.ConvertPrecision`) knows the rules and the user's ``keep_fp32``; this
stage adds what needs data: calibration inputs (the sample and ``calibration_inputs`` random inputs drawn like it, or
the user's ``calibration``), measured islands (the float32 graph on ONNX Runtime with every intermediate observed),
and, when the result misses the tolerance on the calibration inputs, the accuracy-driven search against PyTorch
fp32. It reports islands with reasons, casts, the share of compute in the low type, and warns (or raises under
``precision_strict``) when that share is small.

On ONNX Runtime's CPU provider a bfloat16 graph does not run and a float16 graph runs with roundings dropped (see
:mod:`pipeline.runtime.ort.half_emulation`), so :func:`runnable_model` gives that backend the float32 emulation that
rounds at every half tensor, while ``module.onnx`` stays the real low-precision graph TensorRT builds.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from converters.errors import ConversionError, InputError
from passes import GraphPass, PassManager, RemoveDeadNodes, TopologicalSort, to_graph, to_model
from passes.model_io.external_data import check_model, has_weights_dir, ort_session_bytes
from passes.precision.convert import ConvertPrecision, plan_precision
from passes.precision.types import LOW_TYPES, LowType
from passes.records import Island, PassRecord
from pipeline.accuracy.anchoring import anchored_per_input
from pipeline.accuracy.distribution import random_outputs
from pipeline.exporting.stage import ExportedGraph
from pipeline.precision.build_fallback import build_fallback
from pipeline.precision.buildable import BuilderGate
from pipeline.precision.measure import measured_islands, session_feed
from pipeline.precision.report import judge_share
from pipeline.precision.search import search_islands
from pipeline.precision.share import ComputeShare, compute_share
from pipeline.progress import quiet_info
from pipeline.runtime.io_spec import IOSpec, TensorSpec, normalise_sample
from pipeline.runtime.ort.session_graph import emulated_on_cpu, runnable_model  # noqa: F401 -- moved
from pipeline.runtime.reports.precision import PrecisionReport, SearchSummary
from pipeline.settings import DEFAULT_TOLERANCES, Settings, Tolerance
from pipeline.validation.stage import Feed, ScreeningTorchRunner, TorchRunner, validation_feeds

logger = logging.getLogger(__name__)

#: Calibration inputs are drawn with another seed than validation inputs, so validation sees unseen inputs.
CALIBRATION_SEED_OFFSET = 7919
#: Opset from which Conv, pooling and Einsum take bfloat16.
BF16_OPSET = 22


def effective_settings(settings: Settings) -> Settings:
    """bfloat16 exports at opset 22 unless an opset was given: before it, Conv and pooling cannot take bfloat16."""
    if settings.precision == "bf16" and settings.opset is None:
        return dataclasses.replace(settings, opset=BF16_OPSET)
    return settings


def validation_settings(settings: Settings) -> Settings:
    """Outputs stay float32, but the graph computes in the low type: float32 outputs are judged by its tolerance. A
    quantized precision (int8, fp8, int4, nvfp4) is judged by the quantization's own per-output tolerances
    (:func:`pipeline.quantize.stage.quantized_validation_settings`): its settings are returned as they are."""
    if settings.precision not in LOW_TYPES:
        return settings
    low = LOW_TYPES[settings.precision]
    return dataclasses.replace(settings, tolerances={**settings.tolerances, "float32": _tolerance(settings, low)})


def _tolerance(settings: Settings, low: LowType) -> Tolerance:
    """The low type's tolerance: the user's ``tolerances["float16"]`` (or bfloat16) if given, else the default."""
    return settings.tolerances.get(low.dtype_name, DEFAULT_TOLERANCES[low.dtype_name])


def passes_before_precision(passes: Sequence[GraphPass], settings: Settings) -> Sequence[GraphPass]:
    """The pass list without its precision pass when a low precision is asked: the precision stage runs that pass
    itself, with the measured and searched islands."""
    if settings.precision == "fp32":
        return passes
    return tuple(p for p in passes if not isinstance(p, ConvertPrecision))


def calibration_feeds(io: IOSpec, sample: Any, calibration: Iterable[Any] | None, settings: Settings) -> list[Feed]:
    """The user's calibration samples, or the sample and ``calibration_inputs`` inputs drawn like it (other seed
    than validation), plus each dynamic dimension's min and max; and, when the conversion validates, the inputs
    validation draws: a graph whose search passed on its calibration inputs failed validation on a draw the search
    never saw (ERNIE 4.5 MoE and BiT in float16)."""
    if calibration is not None:
        feeds = [_feed(io, item, index) for index, item in enumerate(calibration)]
        if not feeds:
            raise InputError("calibration= is empty", fix="give at least one sample, or leave it out")
        return feeds
    drawn = dataclasses.replace(
        settings, validation_inputs=settings.calibration_inputs, seed=settings.seed + CALIBRATION_SEED_OFFSET
    )
    inputs = io.flatten_call(*normalise_sample(sample))
    feeds = validation_feeds(io, inputs, drawn)
    if settings.validate:  # the inputs validation will judge too (not the sample twice): the search sees them all
        feeds += validation_feeds(io, inputs, settings)[1:]
    return feeds


def _feed(io: IOSpec, item: Any, index: int) -> Feed:
    """One ``calibration=`` sample as a feed, its shapes checked against the graph's inputs before anything runs."""
    tensors = io.flatten_call(*normalise_sample(item))
    for spec, tensor in zip(io.inputs, tensors, strict=True):
        _check_calibration_shape(spec, tuple(tensor.shape), index)
    return {spec.name: t.detach().cpu().numpy() for spec, t in zip(io.inputs, tensors, strict=True)}


def _check_calibration_shape(spec: TensorSpec, given: tuple[int, ...], index: int) -> None:
    """A calibration tensor has the graph input's rank and every static dimension of it (the sample's); a dimension
    the graph names is dynamic and takes any size."""
    expected = spec.shape
    fits = len(given) == len(expected) and all(
        isinstance(e, str) or e == g for e, g in zip(expected, given, strict=False)
    )
    if fits:
        return
    shape = "[" + ", ".join(str(e) for e in expected) + "]"
    raise InputError(
        f"calibration sample {index}: input {spec.name!r} has shape {list(given)}, but the graph takes {shape} (the "
        "sample's shape; a named dimension is dynamic)",
        fix=f"give calibration samples shaped like the sample ({shape} for {spec.name!r}), or declare the differing "
        "dimension dynamic (dynamic={'" + spec.name + "': {axis: (name, min, opt, max)}})",
    )


def torch_references(model: torch.nn.Module, io: IOSpec, feeds: Sequence[Feed]) -> list[dict[str, np.ndarray]]:
    """PyTorch's outputs on each feed (the references of calibration and search)."""
    runner = TorchRunner(model, io)
    return [runner.infer_impl(dict(feed)) for feed in feeds]


def screened_references(
    model: torch.nn.Module,
    io: IOSpec,
    feeds: Sequence[Feed],
    given: int,
    purpose: str = "calibration",
    required: bool = True,
) -> tuple[list[Feed], list[dict[str, np.ndarray]]]:
    """The feeds PyTorch takes and its outputs on them, screened as validation screens its inputs
    (``ScreenedFeeds``): a drawn feed PyTorch raises on is dropped with a WARNING (at DEBUG
    for ``purpose="validation"``: validation itself reports it); one of the first ``given`` (the user's: the sample,
    or every ``calibration=`` input) is an InputError; none left is an InputError when the feeds are ``required``
    (not when they only add to others already taken)."""
    from pipeline.validation.screening import ScreenedFeeds

    runner = ScreeningTorchRunner(model, io)
    level = logging.WARNING if purpose == "calibration" else logging.DEBUG
    kept: list[Feed] = []
    references: list[dict[str, np.ndarray]] = []
    with runner:  # a Polygraphy runner gives its input metadata (the feeds' casts) once activated
        for feed in ScreenedFeeds(list(feeds), runner, given, purpose, level):
            kept.append(feed)
            references.append(runner.infer_impl(feed))  # the outputs computed while screening it
    if not kept and required:
        raise InputError(
            f"PyTorch refused every one of the {len(feeds)} {purpose} inputs",
            fix="pass convert(calibration=[...]) with inputs the model takes",
        )
    return kept, references


def error_ratio(
    outputs: Sequence[dict[str, np.ndarray]],
    references: Sequence[dict[str, np.ndarray]],
    tolerances: dict[str, Tolerance] | Sequence[dict[str, Tolerance]],
) -> float:
    """The worst :func:`pipeline.accuracy.stats.tolerance_ratio` over every output and input: at most 1 passes (the
    validation rule, magnitude-relative for float16/bfloat16); inf or NaN where PyTorch is finite is inf.
    ``tolerances`` is one mapping for every input, or one per input (the anchored rule's)."""
    from pipeline.accuracy.stats import tolerance_ratio

    per_input = [tolerances] * len(outputs) if isinstance(tolerances, dict) else list(tolerances)
    worst = 0.0
    for index, (got, want, judged) in enumerate(zip(outputs, references, per_input, strict=True)):
        for name, tolerance in judged.items():
            if np.shape(got[name]) != np.shape(want[name]):  # no precision choice changes a shape
                raise ConversionError(
                    f"output {name!r} has shape {list(np.shape(got[name]))} in the graph and "
                    f"{list(np.shape(want[name]))} in PyTorch on calibration input {index}: the graph differs from "
                    "PyTorch whatever its precision",
                    fix="convert with precision='fp32' for validation's report of it (the output and the module "
                    "computing it), and fix that first",
                )
            worst = max(worst, tolerance_ratio(got[name], want[name], tolerance))
    return worst


class _Candidates:
    """Builds the low-precision graph for a set of extra islands and scores it on the calibration inputs."""

    def __init__(
        self,
        fp32_model: onnx.ModelProto,
        exported: ExportedGraph,
        settings: Settings,
        base: ConvertPrecision,
        feeds: Sequence[Feed],
        references: Sequence[dict[str, np.ndarray]],
    ) -> None:
        self.fp32_model, self.exported, self.settings, self.base = fp32_model, exported, settings, base
        self.feeds, self.references = feeds, references
        low = LOW_TYPES[settings.precision]
        # an output that depends on a random node has no value to compare value by value (validation judges its
        # distribution): the search is scored on the others, and needs no run when there are none
        random = random_outputs(fp32_model)
        if random:
            logger.info("precision: %s depend on random nodes: not scored value by value", ", ".join(sorted(random)))
        self.tolerances = {
            o.name: settings.tolerance_for(o.name, low.dtype_name if o.dtype == "float32" else o.dtype)
            for o in exported.io.outputs
            if o.name not in random
        }
        self.per_input: list[dict[str, Tolerance]] | None = None  # the anchored rule's, once the fixed one fails
        self.builds = 0
        self.gate = BuilderGate(fp32_model, settings.dynamic)

    def build(self, islands: Sequence[Island]) -> tuple[onnx.ModelProto, list[PassRecord]]:
        graph, metadata = to_graph(self.fp32_model)
        manager = PassManager([self.base.with_islands(islands), RemoveDeadNodes(), TopologicalSort()])
        graph, records = manager.run(graph, self.settings)
        self.builds += 1
        model = to_model(graph, self.fp32_model, {**self.exported.node_metadata, **metadata})
        if has_weights_dir(self.fp32_model):
            # the float32 weights the pass read are held by the graph, a reference cycle: free them now, not
            # whenever the cyclic collector next runs (each candidate would add a copy of the weights meanwhile)
            del graph
            gc.collect()
        return model, records

    def score(self, model: onnx.ModelProto) -> float:
        names = list(self.tolerances)
        if not names:
            return 0.0
        session = _session(runnable_model(model, "onnxruntime", self.settings), self.settings)
        outputs = []
        for index, feed in enumerate(self.feeds):
            try:
                outputs.append(dict(zip(names, session.run(names, session_feed(session, feed)), strict=True)))
            except Exception as error:  # ONNX Runtime refusing the graph on an input: said, with the stage, not raw
                raise ConversionError(
                    f"the {self.settings.precision} graph failed to run on calibration input {index} on ONNX "
                    f"Runtime (PyTorch ran it): {str(error).strip()}",
                    fix="keep the node the error names in float32 (keep_fp32=[...]), pass calibration=[...] with "
                    "inputs like the sample, or convert with precision='fp32'",
                ) from error
        return error_ratio(outputs, self.references, self.per_input or self.tolerances)


def _session(model: onnx.ModelProto, settings: Settings) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if settings.ort_intra_op_threads is not None:
        options.intra_op_num_threads = settings.ort_intra_op_threads
    return ort.InferenceSession(
        ort_session_bytes(model, options), sess_options=options, providers=["CPUExecutionProvider"]
    )


def convert_precision(
    fp32_model: onnx.ModelProto,
    exported: ExportedGraph,
    model: torch.nn.Module,
    sample: Any,
    calibration: Iterable[Any] | None,
    settings: Settings,
    passes: Sequence[GraphPass] = (),
    screened: tuple[list[Feed], list[dict[str, np.ndarray]]] | None = None,
) -> tuple[onnx.ModelProto, list[PassRecord], PrecisionReport]:
    """The float32 graph after the passes -> the low-precision final graph, its pass records and the report.

    ``passes`` is the conversion's pass list: its :class:`ConvertPrecision` (with any islands it was given) is used,
    or a default one. ``screened`` (the calibration feeds and PyTorch's outputs on them, as
    :func:`screened_references` gives them) saves screening and running them again (the quantize stage's fp16 part).
    """
    low = LOW_TYPES[settings.precision]
    base = next((p for p in passes if isinstance(p, ConvertPrecision)), ConvertPrecision())
    if screened is not None:
        feeds, references = screened
    else:
        feeds = calibration_feeds(exported.io, sample, calibration, settings)
        if settings.precision_io == "low":  # the graph takes low inputs: measure, search and compare on those values
            feeds = [{name: _rounded(value, low) for name, value in feed.items()} for feed in feeds]
        given = len(feeds) if calibration is not None else 1
        feeds, references = screened_references(model, exported.io, feeds, given)
    islands: list[Island] = []
    if settings.precision_measure:
        islands = measured_islands(fp32_model, feeds, low, settings.precision_range_margin, settings.ort_providers)
    candidates = _Candidates(fp32_model, exported, settings, base, feeds, references)
    final, records = candidates.build(islands)
    error = candidates.score(final)
    anchor_note = ""
    if error > 1 and settings.accuracy_anchor:  # the fixed tolerance fails: judge by PyTorch's own error instead
        candidates.per_input, anchor_note = anchored_per_input(
            model, exported.io, feeds, references, candidates.tolerances, low.dtype_name
        )
        fixed, error = error, candidates.score(final)
        anchor_note = f"the fixed {low.dtype_name} tolerance fails on the calibration inputs ({fixed:.3g} x); " + (
            anchor_note or "PyTorch's own run is not available"
        )
        logger.info("precision: %s: %.3g x that tolerance", anchor_note, error)
    search, search_warning = None, ""
    if error > 1 and settings.precision_search:
        logger.info("precision: error %.3g x the tolerance on the calibration inputs; searching", error)
        with quiet_info(logging.getLogger("passes.precision.convert")):  # one pass summary per try: the bar instead
            searched = search_islands(candidates, islands, final, error)
        search, search_warning = searched.summary, searched.warning
        if search is not None:
            islands = [*islands, *searched.islands]
            final, records = candidates.build(islands)
            error = search.error_after
    _check_valid(final)
    # the builder judges the graph kept, searched or not (one build when it builds), not each candidate of the
    # search: a build of Florence-2's encoder graph took 40-55 s, and most candidates are never kept
    fallback = build_fallback(candidates.build, candidates.gate, fp32_model, settings, islands, final)
    if fallback is not None:
        islands, final, records = [*islands, *fallback.islands], fallback.model, fallback.records
        _check_valid(final)
        error = candidates.score(final)
    report, share = _report(fp32_model, final, settings, [*base.islands, *islands], len(feeds), error, search)
    notes = [note for note in (anchor_note, fallback.note if fallback else "") if note]
    if notes:
        report = dataclasses.replace(report, notes=(*report.notes, *notes))
    if search_warning:
        report = dataclasses.replace(report, warnings=(search_warning, *report.warnings))
    return final, records, judge_share(report, share, settings)


def _rounded(value: np.ndarray, low: LowType) -> np.ndarray:
    return value.astype(low.numpy_type).astype(np.float32) if value.dtype == np.float32 else value


_HALF_DTYPES = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}


def boundary_io(io: IOSpec, model: onnx.ModelProto) -> IOSpec:
    """``io`` with the dtypes of ``model``'s half graph inputs and outputs (``precision_io="low"``): what the
    converted module takes and returns. The model's own ``io`` stays what PyTorch takes."""
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}

    def retyped(specs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
        return tuple(
            dataclasses.replace(t, dtype=_HALF_DTYPES[types[t.name]]) if types.get(t.name) in _HALF_DTYPES else t
            for t in specs
        )

    inputs, outputs = retyped(io.inputs), retyped(io.outputs)
    if (inputs, outputs) == (io.inputs, io.outputs):
        return io
    return dataclasses.replace(io, inputs=inputs, outputs=outputs)


def _check_valid(model: onnx.ModelProto) -> None:
    try:
        check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ConversionError(
            f"the graph after the precision pass is not valid ONNX: {exc}",
            fix="convert with precision='fp32' to confirm, and report the model that triggers it",
        ) from exc


def _report(
    fp32_model: onnx.ModelProto,
    final: onnx.ModelProto,
    settings: Settings,
    islands: Sequence[Island],
    calibration_inputs: int,
    error: float,
    search: SearchSummary | None,
) -> tuple[PrecisionReport, ComputeShare]:
    low = LOW_TYPES[settings.precision]
    plan = plan_precision(to_graph(fp32_model)[0], settings, islands)
    share = compute_share(final, low, {d.name: d.opt for d in settings.dynamic})
    tolerance = _tolerance(settings, low)
    notes = [
        f"graph inputs and outputs keep their types: float32 outputs are validated against PyTorch fp32 with the "
        f"{low.dtype_name} tolerance (atol {tolerance.atol:g}, rtol {tolerance.rtol:g})"
        if settings.precision_io == "model"
        else f"graph inputs and outputs are {low.dtype_name} (precision_io='low'): PyTorch fp32 gets the same inputs "
        f"widened, and outputs are validated against it with the {low.dtype_name} tolerance (atol "
        f"{tolerance.atol:g}, rtol {tolerance.rtol:g})"
    ]
    if emulated_on_cpu(final, settings):
        notes.append(
            f"on ONNX Runtime's CPU provider the {low.dtype_name} graph runs as a float32 emulation rounding every "
            f"{low.dtype_name} tensor (see README: Precision); module.onnx is the {low.dtype_name} graph"
            + (f" (opset {settings.opset})" if settings.opset else "")
        )
    warnings = [f"keep_fp32 entry {entry!r} matched no node" for entry in plan.unmatched]
    if error > 1:
        warnings.append(
            f"the {low.dtype_name} graph misses the tolerance on the calibration inputs (worst error {error:.3g} x "
            "the tolerance)" + ("" if settings.precision_search else "; precision_search=True would look for islands")
        )
        logger.warning("precision: %s", warnings[-1])
    report = PrecisionReport(
        precision=low.name,
        dtype=low.dtype_name,
        islands=plan.islands,
        unmatched_keep_fp32=plan.unmatched,
        casts_before=sum(n.op_type == "Cast" for n in fp32_model.graph.node),
        casts_after=share.casts,
        low_flops=share.low_flops,
        total_flops=share.total_flops,
        low_nodes=share.low_nodes,
        float_nodes=share.float_nodes,
        share=share.share,
        basis=share.basis,
        calibration_inputs=calibration_inputs,
        calibration_error=error,
        tolerance=tolerance,
        search=search,
        notes=tuple(notes),
        warnings=tuple(warnings),
    )
    return report, share
