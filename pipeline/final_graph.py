"""The stages from a model to its final graph (export, passes, precision or quantization) and the validation of an
executor against PyTorch: what :func:`pipeline.convert` composes with the check and the build, and what
``pipeline.refit`` runs again on a model with new weights (the same passes, precision included).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

from converters.errors import ConversionError
from converters.registry import ConverterRegistry
from passes import GraphPass, PassManager, default_passes, to_graph, to_model
from passes.model_io.external_data import check_model, remove_unused_files
from passes.records import PassRecord
from pipeline.exporting.stage import ExportedGraph, eval_mode, export
from pipeline.precision.stage import (
    boundary_io,
    convert_precision,
    passes_before_precision,
    torch_references,
    validation_settings,
)
from pipeline.quantize.stage import is_quantized, quantize_precision, quantized_validation_settings
from pipeline.rewrite.debug import PassDebugger
from pipeline.runtime.io_spec import IOSpec, normalise_sample
from pipeline.runtime.reports.accuracy import AccuracyReport
from pipeline.runtime.reports.precision import PrecisionReport
from pipeline.runtime.reports.quantization import QuantizationReport
from pipeline.settings import Settings
from pipeline.validation.stage import as_io_types, validate, validation_feeds

logger = logging.getLogger("pipeline")

Stages = list[tuple[str, float]]


@dataclass(frozen=True)
class FinalGraph:
    """What the stages up to the final graph made: the exported graph, the final graph and the passes that ran,
    the module's I/O (the model's types, or half with ``precision_io="low"``), the precision and quantization
    reports, and the settings with every dynamic axis counted from the start."""

    exported: ExportedGraph
    final: onnx.ModelProto
    records: list[PassRecord]
    io: IOSpec
    precision: PrecisionReport | None
    quantization: QuantizationReport | None
    settings: Settings


def final_graph(
    model: torch.nn.Module,
    sample: Any,
    config: Settings,
    registry: ConverterRegistry,
    pass_list: Sequence[GraphPass],
    calibration: Iterable[Any] | None,
    stages: Stages,
    custom_translation_table: dict[Any, Callable[..., Any]] | None = None,
) -> FinalGraph:
    """Export ``model`` on ``sample``, run the passes, then the precision (or quantize) stage: the final graph."""
    with stage_timer("export", stages):
        exported = export(model, sample, config, custom_translation_table, registry.torch_ops())
    if exported.dynamic and exported.dynamic != config.dynamic:  # some made multiples the model needs (WARNING)
        config = dataclasses.replace(config, dynamic=exported.dynamic)
    config = config.with_input_ranks({t.name: len(t.shape) for t in exported.io.inputs})  # axis -1 -> rank - 1
    with stage_timer("passes", stages):
        debug = _debug_inputs(model, exported, sample) if config.debug_passes else None
        final, records = run_passes(exported, config, passes_before_precision(pass_list, config), debug)
    precision = quantization = None
    io = exported.io  # what the converted module takes and returns: the model's types, or half with precision_io
    if is_quantized(config):  # int8/fp8 Q/DQ at weighted ops; int4/nvfp4 4-bit MatMul/Gemm weights (one stage)
        with stage_timer("quantize", stages), eval_mode(model, warn=False):
            final, more, precision, quantization = quantize_precision(
                final, exported, model, sample, calibration, config, pass_list
            )
        records += more
    elif config.precision != "fp32":
        with stage_timer("precision", stages), eval_mode(model, warn=False):
            final, more, precision = convert_precision(final, exported, model, sample, calibration, config, pass_list)
        records += more
        io = boundary_io(exported.io, final)
    if exported.weights is not None:  # files the final graph does not use (fp32 weights it holds as fp16 now,
        remove_unused_files(exported.weights.directory, [final])  # precision candidates): gigabytes each
        # graph-surgeon graphs are reference cycles: the weights the passes read stay in memory until the cyclic
        # collector runs, which allocation counts alone would not trigger soon (a 2.5 GiB array is one allocation)
        gc.collect()
    return FinalGraph(exported, final, records, io, precision, quantization, config)


def validate_executor(model: torch.nn.Module, sample: Any, graph: FinalGraph, runner: Any) -> AccuracyReport:
    """Validate a Polygraphy ``runner`` of the final graph (or its engine) against ``model``: the sample and
    ``validation_inputs`` draws like it, with the tolerances of the graph's precision or quantization."""
    config, exported = graph.settings, graph.exported
    with eval_mode(model, warn=False):
        feeds = graph_feeds(sample, graph)
        checked = (
            quantized_validation_settings(config, graph.quantization)
            if graph.quantization is not None
            else validation_settings(config)
        )
        return validate(model, exported.io, runner, feeds, checked, backend_io=graph.io, graph=graph.final)


def graph_feeds(sample: Any, graph: FinalGraph) -> list[dict[str, np.ndarray]]:
    """The validation inputs as feeds of the final graph: the sample, ``validation_inputs`` draws like it and, with
    dynamic dimensions, their min and max (validation uses them; so do the profiles between TensorRT segments)."""
    sample_inputs = graph.exported.io.flatten_call(*normalise_sample(sample))
    return as_io_types(validation_feeds(graph.exported.io, sample_inputs, graph.settings), graph.io)


DebugInputs = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]


def _debug_inputs(model: torch.nn.Module, exported: ExportedGraph, sample: Any) -> DebugInputs:
    """The sample as a feed and PyTorch's outputs on it: what every pass is checked against in debug mode."""
    tensors = exported.io.flatten_call(*normalise_sample(sample))
    feed = {spec.name: t.detach().cpu().numpy() for spec, t in zip(exported.io.inputs, tensors, strict=True)}
    with eval_mode(model, warn=False):
        return feed, torch_references(model, exported.io, [feed])[0]


def run_passes(
    exported: ExportedGraph,
    settings: Settings,
    passes: Sequence[GraphPass] | None = None,
    debug: DebugInputs | None = None,
) -> tuple[onnx.ModelProto, list[PassRecord]]:
    """Run the pass list (default: :func:`passes.default_passes` with the default converters) and return the final
    graph. With ``debug`` (the sample as a feed, and PyTorch's outputs on it) every pass that changes the graph is
    checked on ONNX Runtime against PyTorch (debug mode)."""
    from converters.defaults import default_registry

    graph, _ = to_graph(exported.model)
    chosen = default_passes(default_registry()) if passes is None else passes
    observer = (
        None if debug is None else PassDebugger(exported.model, exported.node_metadata, exported.io, *debug, settings)
    )
    manager = PassManager(chosen, max_iterations=settings.max_pass_iterations, observer=observer)
    graph, records = manager.run(graph, settings)
    final = to_model(graph, exported.model, exported.node_metadata)
    try:
        check_model(final)
    except onnx.checker.ValidationError as exc:
        ran = ", ".join(dict.fromkeys(r.name for r in records)) or "none"
        raise ConversionError(
            f"the graph after the passes is not valid ONNX: {exc}; passes run: {ran}",
            fix="find the pass that broke it by running the list without custom passes",
        ) from exc
    return final, records


@contextlib.contextmanager
def stage_timer(name: str, stages: Stages) -> Iterator[None]:
    """Log a stage's start and end, and append ``(name, seconds)`` to ``stages`` (the report's timings)."""
    logger.info("%s ...", name)
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    stages.append((name, seconds))
    logger.info("%s done in %.2f s", name, seconds)
