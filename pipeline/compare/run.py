"""``pipeline.compare``: run PyTorch and the converted graphs on the same inputs and say where they part.

Runners, all through Polygraphy's Comparator: PyTorch (the reference; optionally a float64 copy), ONNX Runtime
on the exported graph (when it holds no opaque custom ops), ONNX Runtime on the final graph, and TensorRT where
it can run. Every output of every backend gets max, mean, median and p99 of absolute and relative error, cosine
similarity and the count of elements outside tolerance (:mod:`pipeline.compare.stats`). ``per_layer=True`` adds
the module-by-module comparison of :mod:`pipeline.compare.layers`, on TensorRT's intermediates where TensorRT
runs (:mod:`pipeline.compare.tensorrt_layers`), else on ONNX Runtime's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import torch

from converters.defaults import default_registry
from converters.errors import InputError
from converters.settings import Settings
from pipeline.compare.layers import DEFAULT_MEMORY_BUDGET, LayerBackend, OnnxRuntimeLayers, compare_layers
from pipeline.compare.report import ComparisonReport, OutputComparison, RunnerInfo
from pipeline.compare.runners import (
    EXPORTED,
    REFERENCE_DTYPES,
    TENSORRT,
    RunnerPlan,
    TorchReference,
    check_backends,
    plan_runners,
)
from pipeline.compare.stats import RULE, ErrorAccumulator
from pipeline.export import ExportedGraph, eval_mode, export
from pipeline.module.io_spec import IOSpec, normalise_sample
from pipeline.validate import Feed, _polygraphy_quiet, validation_feeds
from pipeline.versions import library_versions

if TYPE_CHECKING:
    from pipeline.module.converted import ConvertedModule

logger = logging.getLogger(__name__)


def compare(
    model: torch.nn.Module,
    inputs: Any,
    *,
    backends: str | Sequence[str] = "auto",
    reference_dtype: str = "float32",
    per_layer: bool = False,
    random_inputs: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    output_dir: str | Path | None = None,
    **convert_options: Any,
) -> ComparisonReport:
    """Convert ``model`` with :func:`pipeline.convert` and compare every backend with PyTorch.

    ``inputs`` is one sample (a tensor, a tuple of arguments, a dict of keyword arguments or ``(args,
    kwargs)``), compared with ``random_inputs`` more drawn like it (seeded; default ``validation_inputs``, 3);
    or a list (or any other iterable) of samples, used as given; the first is the conversion's sample.
    ``backends``: ``"auto"`` or names from ``"onnxruntime-exported"``, ``"onnxruntime"``, ``"tensorrt"``.
    ``reference_dtype="float64"`` makes a float64 copy of the model the reference (PyTorch's own float32 run is
    then compared too). ``per_layer=True`` compares module outputs with the final graph's intermediates (on
    TensorRT when it is a runner here, else ONNX Runtime), ``memory_budget`` bytes of them at a time.
    ``output_dir`` writes the report files. Every other keyword goes to :func:`pipeline.convert`: ``converters=``,
    ``passes=``, and settings such as ``tolerances=``,
    ``dynamic=``, ``precision=``.

    >>> report = compare(model, sample, per_layer=True, output_dir="out/compare")  # doctest: +SKIP
    >>> print(report.table()); report.first_divergence.layer.module                 # doctest: +SKIP
    'blocks.3'
    """
    from pipeline.conversion import convert

    check_reference_dtype(reference_dtype)
    check_backends(backends)
    if "backend" in convert_options or "validate" in convert_options:
        raise InputError("compare chooses the backend and does not validate", fix="name the runners in backends=")
    samples, many = _samples(inputs), _is_many(inputs)
    with eval_mode(model):
        module = convert(model, samples[0], backend=_conversion_backend(backends), validate=False, **convert_options)
        exported = _exported_graph(model, samples[0], module.settings, backends, convert_options)
    return compare_converted(  # ``exported`` (and its external weights, if any) lives until this returns
        module,
        model,
        samples,
        many=many,
        exported=None if exported is None else exported.model,
        backends=backends,
        reference_dtype=reference_dtype,
        per_layer=per_layer,
        random_inputs=random_inputs,
        memory_budget=memory_budget,
        output_dir=output_dir,
    )


def compare_module(
    module: ConvertedModule,
    model: torch.nn.Module,
    inputs: Any,
    *,
    tolerances: dict[str, Any] | None = None,
    **options: Any,
) -> ComparisonReport:
    """:meth:`ConvertedModule.compare`: the module's final graph on ONNX Runtime and, for a TensorRT module, its
    own engine, against ``model``. ``options`` are :func:`compare`'s (``backends``, ``reference_dtype``,
    ``per_layer``, ``random_inputs``, ``memory_budget``, ``output_dir``); ``tolerances`` are merged over the
    module's settings. The exported graph is not kept by a converted module, so it is not compared."""
    settings = module.settings
    if tolerances:
        settings = dataclasses.replace(settings, tolerances={**settings.tolerances, **tolerances})
    samples, many = _samples(inputs), _is_many(inputs)
    return compare_converted(module, model, samples, many=many, exported=None, settings=settings, **options)


def compare_converted(
    module: ConvertedModule,
    model: torch.nn.Module,
    samples: list[Any],
    *,
    many: bool,
    exported: onnx.ModelProto | None,
    settings: Settings | None = None,
    backends: str | Sequence[str] = "auto",
    **options: Any,
) -> ComparisonReport:
    """Plan the runners for a converted module (reusing its own executor for its backend) and compare, under
    ``settings`` (default: the module's)."""
    own = module._executor
    settings = settings or module.settings

    def existing(name: str) -> Any:
        return own.polygraphy_runner(name) if name == own.backend else None

    plans = plan_runners(backends, exported, module.onnx, module.io, settings, backend_runner=existing)
    return compare_graphs(model, module.io, module.onnx, settings, plans, samples, many=many, **options)


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
    """The comparison itself, given the graphs and the runners (shared by :func:`compare` and
    :func:`compare_module`)."""
    check_reference_dtype(reference_dtype)
    feeds, source = comparison_feeds(io, samples, many, settings, random_inputs)
    float64 = reference_dtype == "float64"
    with eval_mode(model, warn=False):
        references = _reference_runners(model, io, float64)
        runners = [*references, *(p.runner for p in plans if p.runner is not None)]
        logger.info(
            "comparing %s with %s on %d inputs", ", ".join(r.name for r in runners[1:]), runners[0].name, len(feeds)
        )
        outputs, reference_outputs = compare_outputs(runners, io, feeds, settings)
        layers = None
        if per_layer:
            logger.info("per-layer comparison (memory budget %d MiB)", memory_budget >> 20)
            layers = compare_layers(
                model,
                references[0].model,
                io,
                final,
                feeds,
                settings,
                float64=float64,
                memory_budget=memory_budget,
                backend=layer_backend(plans, final, io, settings),
            )
    infos = [RunnerInfo(r.name, "PyTorch, float64 copy" if r.float64 else "PyTorch") for r in references]
    infos += [RunnerInfo(p.name, p.description, p.skipped) for p in plans]
    report = ComparisonReport(
        model=type(model).__name__,
        reference=runners[0].name,
        reference_dtype=reference_dtype,
        rule=RULE,
        inputs=len(feeds),
        input_source=source,
        runners=tuple(infos),
        outputs=tuple(outputs),
        layers=layers,
        versions=library_versions(),
        final=final,
        io=io,
        settings=settings,
        feeds=feeds,
        reference_outputs=reference_outputs,
    )
    if output_dir is not None:
        report.write(Path(output_dir))
    return report


def layer_backend(plans: Sequence[RunnerPlan], final: onnx.ModelProto, io: IOSpec, settings: Settings) -> LayerBackend:
    """Where per-layer intermediates come from: TensorRT engines when TensorRT is among the runners and runs here,
    else ONNX Runtime on the final graph, with the reason TensorRT was not used."""
    tensorrt = next((p for p in plans if p.name == TENSORRT), None)
    if tensorrt is not None and tensorrt.runner is not None:
        from pipeline.compare.tensorrt_layers import TensorRTLayers

        return TensorRTLayers(final, io, settings)
    why = "not among the backends" if tensorrt is None else f"cannot run here: {tensorrt.skipped}"
    return OnnxRuntimeLayers(final, io, settings, note=f"ONNX Runtime on the final graph (TensorRT {why})")


def check_reference_dtype(reference_dtype: str) -> None:
    if reference_dtype not in REFERENCE_DTYPES:
        raise InputError(
            f"unknown reference_dtype {reference_dtype!r}", fix=f"use one of {', '.join(REFERENCE_DTYPES)}"
        )


def _conversion_backend(backends: str | Sequence[str]) -> str:
    """TensorRT when it is among the runners and can run here (a named one that cannot is an error later),
    else ONNX Runtime."""
    from pipeline.backends.tensorrt.build import tensorrt_status

    wanted = backends == "auto" or TENSORRT in backends
    return "tensorrt" if wanted and tensorrt_status()[0] else "onnxruntime"


def _exported_graph(
    model: torch.nn.Module, sample: Any, settings: Settings, backends: str | Sequence[str], options: dict[str, Any]
) -> ExportedGraph | None:
    """The exporter's graph for the ``onnxruntime-exported`` runner. ``convert`` does not keep it, so the model
    is exported once more (with the same converters' ops opaque)."""
    if backends != "auto" and EXPORTED not in backends:
        return None
    registry = options.get("converters") or default_registry()
    translations = options.get("custom_translation_table")
    return export(model, sample, settings, translations, registry.torch_ops())


def _reference_runners(model: torch.nn.Module, io: IOSpec, float64: bool) -> list[TorchReference]:
    """The reference first; with a float64 reference, PyTorch's own float32 run is compared with it too."""
    if not float64:
        return [TorchReference(model, io, "torch")]
    return [TorchReference(model, io, "torch-float64", float64=True), TorchReference(model, io, "torch")]


def compare_outputs(
    runners: Sequence[Any], io: IOSpec, feeds: Sequence[Feed], settings: Settings
) -> tuple[list[OutputComparison], list[Feed]]:
    """Every runner after the first against the first (the reference), output by output, one input at a time.
    Also returns the reference's outputs per input, cast to the graph's output dtypes (for Polygraphy)."""
    from polygraphy.comparator import Comparator

    tolerances = {spec.name: settings.tolerance_for(spec.name, spec.dtype) for spec in io.outputs}
    accumulators = {
        (r.name, spec.name): ErrorAccumulator(tolerances[spec.name]) for r in runners[1:] for spec in io.outputs
    }
    reference_outputs: list[Feed] = []
    with _polygraphy_quiet():
        for single in Comparator.run(list(runners), data_loader=list(feeds), streaming=True):
            results = [(name, iterations[0]) for name, iterations in single.items()]
            expected = results[0][1]
            reference_outputs.append(
                {s.name: np.array(expected[s.name], dtype=_numpy_dtype(s.dtype)) for s in io.outputs}
            )
            for name, actual in results[1:]:
                for spec in io.outputs:
                    accumulators[(name, spec.name)].add(np.asarray(actual[spec.name]), np.asarray(expected[spec.name]))
    comparisons = []
    for (runner, output), accumulator in accumulators.items():
        spec = next(s for s in io.outputs if s.name == output)
        tolerance = tolerances[output]
        comparisons.append(
            OutputComparison(runner, output, spec.dtype, tolerance.atol, tolerance.rtol, accumulator.result())
        )
    return comparisons, reference_outputs


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


def _samples(inputs: Any) -> list[Any]:
    if not _is_many(inputs):
        return [inputs]
    samples = list(inputs)
    if not samples:
        raise InputError("the iterable of inputs is empty", fix="pass at least one sample")
    return samples


def _is_many(inputs: Any) -> bool:
    """A list, or an iterable that is not a tensor, tuple or dict, holds several samples."""
    if isinstance(inputs, torch.Tensor | tuple | dict | str | bytes):
        return False
    return isinstance(inputs, Iterable)


def _numpy_dtype(name: str) -> Any:
    return np.dtype(name) if name != "bfloat16" else np.float32


__all__ = ["DEFAULT_MEMORY_BUDGET", "compare", "compare_converted", "compare_graphs", "compare_module"]
