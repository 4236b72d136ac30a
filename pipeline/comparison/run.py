"""Comparison of built graphs with PyTorch: run them on the same inputs and say where they part.

:func:`compare_built` takes what a conversion built (an executor and its graph); :func:`pipeline.compare`
(in :mod:`pipeline.conversion`) converts first, or (``module=``) hands over a converted module's own.

Runners, all through Polygraphy's Comparator: PyTorch (the reference; optionally a float64 copy), ONNX Runtime
on the exported graph (when it holds no opaque custom ops), ONNX Runtime on the final graph, and TensorRT where
it can run. Every output of every backend gets max, mean, median and p99 of absolute and relative error, cosine
similarity and the count of elements outside tolerance (:mod:`pipeline.accuracy.stats`). ``per_layer=True`` adds
the module-by-module comparison of :mod:`pipeline.comparison.layers`, on TensorRT's intermediates where TensorRT
runs (:mod:`pipeline.comparison.tensorrt_layers`), else on ONNX Runtime's.

As in validation (:mod:`pipeline.validation.stage`): a drawn input PyTorch itself refuses is dropped (a WARNING, and the
report's ``dropped``; ``validation.screening``), a given sample refused is an InputError; outputs that depend on
random nodes are judged by distribution, outputs that are uninitialised memory by shape and dtype
(:mod:`pipeline.accuracy.uninitialised`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from converters.errors import InputError
from pipeline.accuracy.anchor import AnchorRuns
from pipeline.accuracy.anchoring import Anchoring
from pipeline.accuracy.distribution import DistributionStats, measure_torch_spread
from pipeline.accuracy.stats import RULE, Accumulator, ErrorAccumulator, Judgement, judgement, output_accumulators
from pipeline.accuracy.uninitialised import RULE as UNINITIALISED_RULE
from pipeline.accuracy.uninitialised import ShapeAccumulator, ShapeStats
from pipeline.comparison import DEFAULT_MEMORY_BUDGET, REFERENCE_DTYPES, TENSORRT
from pipeline.comparison.layers import LayerBackend, OnnxRuntimeLayers, compare_layers
from pipeline.comparison.report import ComparisonReport, OutputComparison, RunnerInfo
from pipeline.comparison.runners import ReferenceScreen, RunnerPlan, TorchReference, plan_runners
from pipeline.exporting.stage import eval_mode
from pipeline.runtime.executors import Executor
from pipeline.runtime.io_spec import IOSpec, normalise_sample
from pipeline.runtime.reports.accuracy import DroppedInput
from pipeline.settings import Settings
from pipeline.validation.screening import ScreenedFeeds
from pipeline.validation.stage import Feed, polygraphy_quiet, validation_feeds
from pipeline.versions import library_versions

logger = logging.getLogger(__name__)


def compare_built(
    model: torch.nn.Module,
    inputs: Any,
    *,
    executor: Executor,
    final: onnx.ModelProto,
    io: IOSpec,
    settings: Settings,
    exported: onnx.ModelProto | None = None,
    tolerances: dict[str, Any] | None = None,
    backends: str | Sequence[str] = "auto",
    **options: Any,
) -> ComparisonReport:
    """Compare a built graph with ``model`` on ``inputs``: ``final`` on ONNX Runtime and every other backend in
    ``backends``, where ``executor`` (which runs ``final``) is reused for its own backend, plus ``exported`` (the
    exporter's graph) when given. ``tolerances`` are merged over ``settings``'; ``options`` are
    :func:`compare_graphs`' (``reference_dtype``, ``per_layer``, ``random_inputs``, ``memory_budget``,
    ``output_dir``). :func:`pipeline.compare` calls it."""
    if tolerances:
        settings = dataclasses.replace(settings, tolerances={**settings.tolerances, **tolerances})
    samples, many = split_samples(inputs)

    def existing(name: str) -> Any:
        # a TensorRT-RTX module whose engine cannot run here runs ONNX Runtime: not a TensorRT-RTX runner
        engine_runs = name == "onnxruntime" or getattr(executor, "runs_on", "engine") != "onnxruntime"
        return executor.polygraphy_runner(name) if name == executor.backend and engine_runs else None

    plans = plan_runners(backends, exported, final, io, settings, backend_runner=existing)
    return compare_graphs(model, io, final, settings, plans, samples, many=many, **options)


def compare_graphs(
    model: torch.nn.Module,
    io: IOSpec,
    final: onnx.ModelProto,
    settings: Settings,
    plans: list[RunnerPlan],
    samples: list[Any],
    *,
    many: bool,
    reference_dtype: str = "float32",
    per_layer: bool = False,
    random_inputs: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    output_dir: str | Path | None = None,
) -> ComparisonReport:
    """The comparison itself, given the graphs and the runners (:func:`compare_built` plans them)."""
    check_reference_dtype(reference_dtype)
    feeds, source = comparison_feeds(io, samples, many, settings, random_inputs)
    float64 = reference_dtype == "float64"
    with eval_mode(model, warn=False):
        references = _reference_runners(model, io, float64)
        runners = [*references, *(p.runner for p in plans if p.runner is not None)]
        logger.info(
            "comparing %s with %s on %d inputs", ", ".join(r.name for r in runners[1:]), runners[0].name, len(feeds)
        )
        compared = compare_outputs(runners, io, feeds, settings, final, given=len(samples))
        layers = None
        if per_layer:
            logger.info("per-layer comparison (memory budget %d MiB)", memory_budget >> 20)
            layers = compare_layers(
                model,
                references[0].model,
                io,
                final,
                compared.feeds,  # the inputs PyTorch took
                settings,
                float64=float64,
                memory_budget=memory_budget,
                backend=layer_backend(plans, final, io, settings),
            )
    infos = [RunnerInfo(r.name, "PyTorch, float64 copy" if r.float64 else "PyTorch") for r in references]
    infos += [RunnerInfo(p.name, p.description, p.skipped) for p in plans]
    if compared.dropped:
        source += f"; {len(compared.dropped)} drawn input(s) dropped: PyTorch itself refused them"
    shape_only = any(isinstance(o.stats, ShapeStats) for o in compared.outputs)
    report = ComparisonReport(
        model=type(model).__name__,
        reference=runners[0].name,
        reference_dtype=reference_dtype,
        rule=f"{RULE}; {UNINITIALISED_RULE}" if shape_only else RULE,
        inputs=len(compared.feeds),
        input_source=source,
        runners=tuple(infos),
        outputs=tuple(compared.outputs),
        layers=layers,
        versions=library_versions(),
        final=final,
        io=io,
        settings=settings,
        feeds=compared.feeds,
        reference_outputs=compared.reference_outputs,
        dropped=compared.dropped,
    )
    if output_dir is not None:
        report.write(Path(output_dir))
    return report


def layer_backend(plans: Sequence[RunnerPlan], final: onnx.ModelProto, io: IOSpec, settings: Settings) -> LayerBackend:
    """Where per-layer intermediates come from: TensorRT engines when TensorRT is among the runners and runs here,
    else ONNX Runtime on the final graph, with the reason TensorRT was not used."""
    tensorrt = next((p for p in plans if p.name == TENSORRT), None)
    if tensorrt is not None and tensorrt.runner is not None:
        from pipeline.comparison.tensorrt_layers import TensorRTLayers

        return TensorRTLayers(final, io, settings)
    why = "not among the backends" if tensorrt is None else f"cannot run here: {tensorrt.skipped}"
    return OnnxRuntimeLayers(final, io, settings, note=f"ONNX Runtime on the final graph (TensorRT {why})")


def check_reference_dtype(reference_dtype: str) -> None:
    """Raise an InputError unless ``reference_dtype`` is one of ``REFERENCE_DTYPES``."""
    if reference_dtype not in REFERENCE_DTYPES:
        raise InputError(
            f"unknown reference_dtype {reference_dtype!r}", fix=f"use one of {', '.join(REFERENCE_DTYPES)}"
        )


def _reference_runners(model: torch.nn.Module, io: IOSpec, float64: bool) -> list[TorchReference]:
    """The reference first; with a float64 reference, PyTorch's own float32 run is compared with it too."""
    if not float64:
        return [TorchReference(model, io, "torch")]
    return [TorchReference(model, io, "torch-float64", float64=True), TorchReference(model, io, "torch")]


@dataclass(frozen=True)
class ComparedOutputs:
    """What :func:`compare_outputs` found: each output of each backend runner against the reference, the inputs
    compared (the drawn ones PyTorch refused left out, and listed in ``dropped``) and the reference's outputs on
    each of them, in the graph's output dtypes."""

    outputs: list[OutputComparison]
    feeds: list[Feed]
    reference_outputs: list[Feed]
    dropped: tuple[DroppedInput, ...] = ()


def _anchorings(
    runners: Sequence[Any],
    io: IOSpec,
    judged: dict[str, Judgement],
    accumulators: dict[tuple[str, str], Accumulator | ShapeAccumulator],
) -> dict[str, Anchoring]:
    """Per backend runner, the anchored rule (:mod:`pipeline.accuracy.anchor`) of its element-wise outputs; none
    when the reference is a float64 copy (it is already the exact answer float32 is anchored to)."""
    reference = runners[0]
    if not isinstance(reference, TorchReference) or reference.float64:
        return {}
    runs = AnchorRuns(reference.model, io)
    return {
        r.name: Anchoring(
            reference.model,
            io,
            {n: j for n, j in judged.items() if isinstance(accumulators[(r.name, n)], ErrorAccumulator)},
            runs,
        )
        for r in runners[1:]
    }


def compare_outputs(
    runners: Sequence[Any],
    io: IOSpec,
    feeds: Sequence[Feed],
    settings: Settings,
    final: onnx.ModelProto | None = None,
    given: int | None = None,
) -> ComparedOutputs:
    """Every runner after the first against the first (the reference), output by output, one input at a time,
    under :func:`pipeline.accuracy.stats.judgement` (the validation's policy); outputs that depend on a random node
    of ``final`` are judged by distribution, outputs ``final`` records as uninitialised memory by shape and dtype.
    The first ``given`` feeds (default: all) are the user's: PyTorch refusing one is an InputError; the
    :class:`TorchReference` runners (leading ``runners``) run each later, drawn feed ahead, and one they refuse is
    dropped (a WARNING, and in ``dropped``)."""
    from polygraphy.comparator import Comparator

    judged = {spec.name: judgement(spec.name, spec.dtype, settings) for spec in io.outputs}
    tolerances = {spec.name: judged[spec.name].tolerance for spec in io.outputs}
    references = [r for r in runners if isinstance(r, TorchReference)]
    accumulators: dict[tuple[str, str], Accumulator | ShapeAccumulator] = {
        (r.name, name): kept for r in runners[1:] for name, kept in output_accumulators(final, tolerances).items()
    }
    loader = ScreenedFeeds(list(feeds), ReferenceScreen(references), len(feeds) if given is None else given)
    reference_outputs: list[Feed] = []
    anchorings = _anchorings(runners, io, judged, accumulators)
    compared: list[Feed] = []  # the feeds compared, in order (a random output's yardstick draws PyTorch on them)
    with polygraphy_quiet():
        for single in Comparator.run(list(runners), data_loader=loader, streaming=True):
            results = [(name, iterations[0]) for name, iterations in single.items()]
            expected = results[0][1]
            reference_outputs.append(
                {s.name: np.array(expected[s.name], dtype=_numpy_dtype(s.dtype)) for s in io.outputs}
            )
            if references:
                compared.append(references[0].last_feed)
            for name, actual in results[1:]:
                anchored = anchorings[name].tolerances(runners[0].last_feed, actual, expected) if anchorings else {}
                for spec in io.outputs:
                    acc = accumulators[(name, spec.name)]
                    pair = (np.asarray(actual[spec.name]), np.asarray(expected[spec.name]))
                    if spec.name in anchored and isinstance(acc, ErrorAccumulator):
                        acc.add(*pair, anchored[spec.name])
                    else:
                        acc.add(*pair)
    if references and references[0] is runners[0]:  # the reference is PyTorch: random outputs get its own spread
        measure_torch_spread(((output, acc) for (_, output), acc in accumulators.items()), references[0].call, compared)
    comparisons = []
    for (runner, output), acc in accumulators.items():
        spec = next(s for s in io.outputs if s.name == output)
        j = judged[output]
        stats = acc.result()
        how = anchorings[runner].note(output) if anchorings else ""
        note = "; ".join(filter(None, [j.note, how]))
        if isinstance(stats, DistributionStats | ShapeStats):
            note = stats.note
        comparisons.append(
            OutputComparison(
                runner,
                output,
                spec.dtype,
                j.tolerance.atol,
                j.tolerance.rtol,
                stats,
                j.computed_in,
                note,
                j.tolerance.rms_atol,
                j.tolerance.rms,
            )
        )
    refused = {d.index for d in loader.dropped}
    kept = [feed for index, feed in enumerate(feeds) if index not in refused]
    return ComparedOutputs(comparisons, kept, reference_outputs, tuple(loader.dropped))


def comparison_feeds(
    io: IOSpec, samples: list[Any], many: bool, settings: Settings, random_inputs: int | None
) -> tuple[list[Feed], str]:
    """Polygraphy feeds for the samples, plus ``random_inputs`` drawn like the first (default: the setting's
    ``validation_inputs`` for one sample, none for an iterable); and a description for the report."""
    count = settings.validation_inputs if random_inputs is None else random_inputs
    if count < 0:
        raise InputError("random_inputs must be >= 0", fix="pass random_inputs=0 or more")
    flat = [io.flatten_call(*normalise_sample(s)) for s in samples]
    feeds = [
        {spec.name: t.detach().cpu().numpy() for spec, t in zip(io.inputs, tensors, strict=True)} for tensors in flat
    ]
    drawn: list[Feed] = []
    if not (many and random_inputs is None):  # samples given as an iterable are used as they are
        drawn = validation_feeds(io, flat[0], dataclasses.replace(settings, validation_inputs=count))[1:]
        drawn = [{name: np.asarray(value) for name, value in feed.items()} for feed in drawn]  # 0-d draws: scalars
    source = f"{len(samples)} given samples" if many else "the sample"
    if drawn:
        extremes = "; 2 of them at the dynamic dimensions' min and max" if settings.dynamic else ""
        source += f" and {len(drawn)} seeded random inputs drawn like it (seed {settings.seed}{extremes})"
    return feeds + drawn, source


def split_samples(inputs: Any) -> tuple[list[Any], bool]:
    """The samples in ``inputs`` and whether it held several: a list, or an iterable that is not a tensor, tuple
    or dict, holds several (an empty one is an InputError); anything else is one sample."""
    if not _is_many(inputs):
        return [inputs], False
    samples = list(inputs)
    if not samples:
        raise InputError("the iterable of inputs is empty", fix="pass at least one sample")
    return samples, True


def _is_many(inputs: Any) -> bool:
    """A list, or an iterable that is not a tensor, tuple or dict, holds several samples."""
    if isinstance(inputs, torch.Tensor | tuple | dict | str | bytes):
        return False
    return isinstance(inputs, Iterable)


def _numpy_dtype(name: str) -> Any:
    return np.dtype(name) if name != "bfloat16" else np.float32


__all__ = ["DEFAULT_MEMORY_BUDGET", "compare_built", "compare_graphs", "split_samples"]
