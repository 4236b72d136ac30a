"""The public compositions: ``convert`` (the stages, in order) and ``compare`` (convert, then compare)."""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from converters.defaults import default_registry
from converters.errors import BuildError, InputError
from converters.registry import ConverterRegistry
from passes import GraphPass, default_passes, insert_passes
from passes.base import Placement
from passes.fusions import FUSED_OPS
from pipeline.backends import build_executor
from pipeline.backends.segments.build import build_segmented, needs_segments
from pipeline.comparison import DEFAULT_MEMORY_BUDGET, EXPORTED, TENSORRT
from pipeline.comparison.report import ComparisonReport
from pipeline.comparison.run import check_reference_dtype, compare_built, split_samples
from pipeline.comparison.runners import check_backends
from pipeline.compatibility.judge import check as judge_check
from pipeline.compatibility.ops import DEFAULT_TRT_VERSION
from pipeline.compatibility.static import CompatibilityReport
from pipeline.compatibility.static import check as static_check
from pipeline.exporting.stage import ExportedGraph, eval_mode, export
from pipeline.final_graph import FinalGraph, final_graph, graph_feeds, stage_timer, validate_executor
from pipeline.precision.stage import (
    effective_settings,
)
from pipeline.quantize.stage import quantize_settings, quantized_validation_settings
from pipeline.refitting import RefitSource
from pipeline.runtime.executors import Executor, select_backend
from pipeline.runtime.generation.module import module_class
from pipeline.runtime.module import ConvertedModule
from pipeline.runtime.reports.accuracy import AccuracyReport
from pipeline.runtime.reports.conversion import ConversionReport
from pipeline.runtime.reports.segments import SegmentsReport
from pipeline.runtime.tensorrt.weights import describe as describe_engine_options
from pipeline.settings import Settings
from pipeline.versions import library_versions

logger = logging.getLogger("pipeline")


def convert(
    model: torch.nn.Module,
    sample: Any,
    *,
    converters: ConverterRegistry | None = None,
    passes: Sequence[GraphPass] | None = None,
    extra_passes: Sequence[Placement] = (),
    custom_translation_table: dict[Any, Callable[..., Any]] | None = None,
    calibration: Iterable[Any] | None = None,
    **settings: Any,
) -> ConvertedModule:
    """Convert ``model`` (called on ``sample``) and return a module that runs on the chosen backend.

    ``sample`` is a tensor, a tuple of tensors, or ``(args, kwargs)``. ``converters`` replaces the default
    converter registry (:func:`converters.default_registry`); ``passes`` replaces the default pass list
    (:func:`passes.default_passes` with those converters); ``extra_passes`` places your own passes at named
    points, ``[("after", "fold_constants", MyPass())]``; ``custom_translation_table`` goes to the exporter.
    ``calibration`` (samples like ``sample``) feeds the precision stage when ``precision`` is "fp16" or "bf16", and
    the quantize stage's calibration when it is "int8" or "fp8" (and AWQ's when it is "int4" or "nvfp4").
    Every other keyword is a :class:`Settings` field, e.g. ``backend="onnxruntime"``,
    ``dynamic={"x": {0: ("batch", 1, 8, 32)}}``, ``tolerances={"float32": (1e-5, 1e-4)}``, ``validate=False``.

    >>> module = convert(torch.nn.Linear(4, 2).eval(), torch.randn(3, 4))  # doctest: +SKIP
    >>> print(module.report.summary())                                      # doctest: +SKIP
    """
    config = quantize_settings(effective_settings(Settings.from_kwargs(settings)))
    registry = default_registry() if converters is None else converters
    chosen = _Chosen(converters, passes, extra_passes, custom_translation_table, calibration)
    if config.generation is not None:
        from pipeline.generation import check_transformers

        check_transformers()  # before the modules that import transformers' newer names
        from pipeline.generation.cross_layout import takes_images
        from pipeline.generation.own_preparation import is_encoder_decoder
        from pipeline.generation.vision_inputs import is_vision_language

        def part_of(part: torch.nn.Module, part_sample: Any, part_config: Settings, part_registry: Any) -> Any:
            """One graph of a generation kind of two (its own sample and settings) through the stages."""
            return _convert_prepared(part, part_sample, part_config, part_registry, chosen, part, part_sample)

        if is_encoder_decoder(model):  # an encoder graph and a cached decoder step, converted one after the other
            from pipeline.generation.encoder_decoder import convert_encoder_decoder

            return convert_encoder_decoder(model, sample, config, registry, part_of)  # type: ignore[return-value]
        if is_vision_language(model, sample):  # a vision graph and the cached text step, converted one after the other
            from pipeline.generation.vision_language import convert_vision_language

            return convert_vision_language(model, sample, config, registry, part_of)  # type: ignore[return-value]
        if takes_images(model, sample):  # images its text cross-attends to: an image graph and the cached text step
            from pipeline.generation.cross_images import convert_cross_images

            return convert_cross_images(model, sample, config, registry, part_of)  # type: ignore[return-value]
        from pipeline.generation.conversion import prepare_step

        # the cached decoder step of a causal LM is what the stages convert
        step, step_sample, config, registry = prepare_step(model, sample, config, registry)
        prompt = None
        if config.generation is not None and config.generation.prompt_tokens:
            from pipeline.generation.prompt_graph import prompt_sample

            # a recurrent model's prompt graph first: the step's validation decodes with both
            prompt_input, prompt_config = prompt_sample(step_sample, config)
            prompt = _convert_prepared(step, prompt_input, prompt_config, registry, chosen, step, prompt_input)
        return _convert_prepared(step, step_sample, config, registry, chosen, model, sample, prompt)
    return _convert_prepared(model, sample, config, registry, chosen, model, sample)


@dataclasses.dataclass(frozen=True)
class _Chosen:
    """What the caller of :func:`convert` chose besides the settings."""

    converters: ConverterRegistry | None
    passes: Sequence[GraphPass] | None
    extra_passes: Sequence[Placement]
    custom_translation_table: dict[Any, Callable[..., Any]] | None
    calibration: Iterable[Any] | None


def _convert_prepared(
    model: torch.nn.Module,
    sample: Any,
    config: Settings,
    registry: ConverterRegistry,
    chosen: _Chosen,
    original: torch.nn.Module,
    original_sample: Any,
    prompt: ConvertedModule | None = None,
) -> ConvertedModule:
    """The stages on ``model`` (the caller's, or the cached step prepared from ``original``); ``prompt``: a recurrent
    model's converted prompt graph, with which the step decodes (validation included) and which it holds."""
    passes, extra_passes, calibration = chosen.passes, chosen.extra_passes, chosen.calibration
    custom_translation_table, converters = chosen.custom_translation_table, chosen.converters
    stages: list[tuple[str, float]] = []
    pass_list = insert_passes(default_passes(registry) if passes is None else passes, extra_passes)
    choice = select_backend(config.backend, config)
    graph = final_graph(model, sample, config, registry, pass_list, calibration, stages, custom_translation_table)
    final, config = graph.final, graph.settings
    if choice.name in ("tensorrt", "tensorrt-rtx") and not config.shape_tensor_values:
        config = _sample_shape_values(final, sample, graph, config)
    with stage_timer("check", stages):
        compatibility = check_for_backend(final, choice.name, config)
    segments: SegmentsReport | None = None
    executor: Executor
    with stage_timer("build", stages):
        if needs_segments(choice.name, final, compatibility, config):  # TensorRT segments, ONNX Runtime for the rest
            feeds = graph_feeds(sample, graph)
            executor, segments = build_segmented(choice.name, final, graph.io, config, compatibility, feeds)
        else:
            executor = build_executor(choice.name, final, graph.io, config)
    accuracy: AccuracyReport | None = None
    if config.validate:
        with stage_timer("validate", stages):
            accuracy = validate_executor(model, sample, graph, executor.polygraphy_runner(choice.name))
            # (a part of a two-graph model, converted as its own original, is decoded by its caller)
            if config.generation is not None and config.generation.kind == "decoder" and original is not model:
                # whole decodings against the model's own cached generate
                from pipeline.generation.validation import validate_decoding

                # a quantized step's logits are judged by the quantization's own envelope, as its plain outputs are
                judged = quantized_validation_settings(config, graph.quantization)
                prompt_executor = prompt.executor if prompt is not None else None
                decoding = validate_decoding(
                    original, executor, graph.io, original_sample, judged, prompt=prompt_executor
                )
                accuracy = dataclasses.replace(accuracy, decoding=decoding)
    report = ConversionReport(
        backend=choice.name,
        backend_reason=choice.reason,
        stages=tuple(stages),
        passes=tuple(graph.records),
        nodes_exported=len(graph.exported.model.graph.node),
        nodes_final=len(final.graph.node),
        accuracy=accuracy,
        versions=library_versions(),
        compatibility=compatibility.to_dict(),
        precision=graph.precision,
        quantization=graph.quantization,
        engine_options=describe_engine_options(config) if choice.name in ("tensorrt", "tensorrt-rtx") else None,
        segments=segments,
        fused_ops=fused_ops(graph.exported.model, final),
        dropped_outputs=dict(graph.exported.dropped_outputs),
        traced_branches=dict(graph.exported.traced_branches),
    )
    source = RefitSource(weakref.ref(model), sample, converters, tuple(pass_list), custom_translation_table)
    module = module_class(config)(executor, graph.io, final, config, report, graph.exported.weights, source)
    if prompt is not None:
        module.hold_prompt_graph(prompt)
    return module


def _sample_shape_values(final: onnx.ModelProto, sample: Any, graph: FinalGraph, config: Settings) -> Settings:
    """``config`` with the sample's values of the inputs TensorRT may read as shape tensors
    (:mod:`pipeline.backends.tensorrt.shape_inputs`): the engine is built for exactly those values, as said here."""
    from pipeline.backends.tensorrt.shape_inputs import known_ranges, shape_value_candidates

    ranged = known_ranges(config)  # a generation step's past_length: every cache position, not the sample's
    candidates = [name for name in shape_value_candidates(final) if name not in ranged]
    if not candidates:
        return config
    feed = graph_feeds(sample, graph)[0]  # the sample, as the final graph's inputs
    values = {name: feed[name] for name in candidates if name in feed}
    if not values:
        return config
    logger.warning(
        "input(s) %s size tensors in the graph by their values: a TensorRT engine takes exactly the sample's (%s); "
        "pass shape_tensor_values={name: values} for others",
        ", ".join(map(repr, values)),
        "; ".join(f"{n} = {np.asarray(v).tolist()}" for n, v in values.items()),
    )
    return dataclasses.replace(config, shape_tensor_values=values)  # type: ignore[arg-type]  # normalised


def fused_ops(exported: onnx.ModelProto, final: onnx.ModelProto) -> dict[str, int]:
    """How many ``RMSNormalization`` and ``RotaryEmbedding`` nodes the passes made (:mod:`passes.fusions`)."""
    counts = {}
    for op in FUSED_OPS:
        made = sum(n.op_type == op for n in final.graph.node) - sum(n.op_type == op for n in exported.graph.node)
        if made > 0:
            counts[op] = made
    return counts


def check(
    model: torch.nn.Module | onnx.ModelProto | str | Path,
    trt_version: str | None = None,
    *,
    sample: Any = None,
    parser: str = "auto",
    build: bool = False,
    converters: ConverterRegistry | None = None,
    **settings: Any,
) -> CompatibilityReport:
    """``pipeline.check``: will TensorRT take this graph? ``model`` is an ONNX ModelProto, a path to an ``.onnx``
    file or a ``.ptrt`` artifact, or an ``nn.Module`` with ``sample=``, converted first (on ONNX Runtime, without
    validation; ``converters`` and ``settings`` go to :func:`convert`) so that the graph judged is the one
    ``convert`` would build. See :func:`pipeline.compatibility.judge.check` for ``trt_version``, ``parser`` and
    ``build``.

    >>> pipeline.check(model, sample=torch.randn(1, 3, 224, 224), parser="tensorrt-rtx", build=True)  # doctest: +SKIP
    """
    if isinstance(model, torch.nn.Module):
        if sample is None:
            raise InputError(
                "pipeline.check of an nn.Module needs the sample to export it with",
                fix="pass sample=..., as to pipeline.convert, or check an .onnx file or artifact",
            )
        kept = {k: v for k, v in settings.items() if k not in ("backend", "validate")}
        module = convert(model, sample, backend="onnxruntime", validate=False, converters=converters, **kept)
        build_settings = {k: v for k, v in kept.items() if k == "dynamic" or k.startswith("trt_")}
        return judge_check(module.onnx, trt_version, parser=parser, build=build, **build_settings)
    if sample is not None:
        raise InputError("sample= is only for an nn.Module", fix="drop sample= when checking an ONNX graph")
    return judge_check(model, trt_version, parser=parser, build=build, **settings)


def check_for_backend(final: onnx.ModelProto, backend: str, settings: Settings) -> CompatibilityReport:
    """The parser check of the final graph: an error before a TensorRT build, a report entry otherwise. The judge
    is the backend's own parser for a TensorRT backend, else ``check_parser`` (auto: a real parser when one imports,
    else the static table)."""
    from converters.plugins.spec import plugin_nodes
    from pipeline.compatibility.judge import judge_library
    from pipeline.compatibility.real import real_check
    from pipeline.runtime.tensorrt.library import LIBRARIES, rtx_plugin_error

    trt_backend = backend in LIBRARIES
    version = settings.trt_check_version
    if version is None and backend == "tensorrt":
        version = library_versions().get("tensorrt")
    auto = trt_backend and settings.check_parser == "auto"
    library = LIBRARIES[backend] if auto else judge_library(settings.check_parser, settings.trt_check_version)
    segmented = trt_backend and settings.fallback == "onnxruntime"  # rejected nodes go to ONNX Runtime segments
    if backend == "tensorrt-rtx" and plugin_nodes(final) and not segmented:
        raise rtx_plugin_error([n.name for n in plugin_nodes(final)])
    report = (
        static_check(final, trt_version=version or DEFAULT_TRT_VERSION)
        if library is None
        else real_check(final, library)
    )
    if report.problems and trt_backend and not segmented:
        raise BuildError(
            f"{report.parser} would reject {len(report.problems)} node(s):\n"
            + "\n".join(
                f"  {p.op} {p.node}: {p.reason}" + (f"; fix: {p.fix}" if p.fix else "") for p in report.problems
            ),
            fix="apply the fixes listed per node, or convert with fallback='onnxruntime' (TensorRT segments, ONNX "
            "Runtime for these nodes) or backend='onnxruntime'",
        )
    if report.problems:
        logger.info(
            "the final graph has %d node(s) TensorRT would reject; see report.compatibility", len(report.problems)
        )
    return report


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
    module: ConvertedModule | None = None,
    **convert_options: Any,
) -> ComparisonReport:
    """Convert ``model`` with :func:`convert` (or take the converted ``module``) and compare every backend with
    PyTorch.

    ``inputs`` is one sample (a tensor, a tuple of arguments, a dict of keyword arguments or ``(args,
    kwargs)``), compared with ``random_inputs`` more drawn like it (seeded; default ``validation_inputs``, 3);
    or a list (or any other iterable) of samples, used as given; the first is the conversion's sample.
    ``backends``: ``"auto"`` or names from ``"onnxruntime-exported"``, ``"onnxruntime"``, ``"tensorrt"``.
    ``reference_dtype="float64"`` makes a float64 copy of the model the reference (PyTorch's own float32 run is
    then compared too). ``per_layer=True`` compares module outputs with the final graph's intermediates (on
    TensorRT when it is a runner here, else ONNX Runtime), ``memory_budget`` bytes of them at a time.
    ``output_dir`` writes the report files. Every other keyword goes to :func:`convert`: ``converters=``,
    ``passes=``, and settings such as ``tolerances=``, ``dynamic=``, ``precision=``.

    ``module=`` compares an already converted (or loaded) module's graph (ONNX Runtime) and engine (TensorRT) with
    ``model`` instead: nothing is converted, the exported graph is not compared (a module does not keep it), outputs
    are judged as ``convert`` judged them (a quantized graph's by its per-output tolerances), and the only other
    keyword taken is ``tolerances=`` (merged over the module's settings).

    >>> report = compare(model, sample, per_layer=True, output_dir="out/compare")  # doctest: +SKIP
    >>> print(report.table()); report.first_divergence.layer.module                 # doctest: +SKIP
    'blocks.3'
    """
    check_reference_dtype(reference_dtype)
    check_backends(backends)
    options = dict(
        backends=backends,
        reference_dtype=reference_dtype,
        per_layer=per_layer,
        random_inputs=random_inputs,
        memory_budget=memory_budget,
        output_dir=output_dir,
    )
    if module is not None:
        return _compare_module(module, model, inputs, options, convert_options)
    if "backend" in convert_options or "validate" in convert_options:
        raise InputError("compare chooses the backend and does not validate", fix="name the runners in backends=")
    samples, many = split_samples(inputs)
    with eval_mode(model):
        converted = convert(model, samples[0], backend=_conversion_backend(backends), validate=False, **convert_options)
        exported = _exported_graph(model, samples[0], converted.settings, backends, convert_options)
    return _compare_module(  # ``exported`` (and its external weights, if any) lives until this returns
        converted, model, samples if many else samples[0], options, {}, None if exported is None else exported.model
    )


def _compare_module(
    module: ConvertedModule,
    model: torch.nn.Module,
    inputs: Any,
    options: dict[str, Any],
    extra: dict[str, Any],
    exported: onnx.ModelProto | None = None,
) -> ComparisonReport:
    """Compare a built module with ``model``, judged by the module's settings (a quantized graph's by its
    per-output tolerances); ``extra`` may hold ``tolerances=`` only."""
    if not isinstance(module, ConvertedModule):
        raise InputError(
            f"compare(module=...) takes a converted module, got {type(module).__name__}",
            fix="pass the module pipeline.convert or pipeline.load returned",
        )
    unknown = sorted(set(extra) - {"tolerances"})
    if unknown:
        raise InputError(
            f"compare(module=...) compares a module as it was converted; it takes no conversion option {unknown}",
            fix="convert again with those options, or leave module= out to convert and compare in one call",
        )
    settings = module.settings
    if module.report.quantization is not None:
        settings = quantized_validation_settings(settings, module.report.quantization)
    return compare_built(
        model,
        inputs,
        executor=module.executor,
        final=module.onnx,
        io=module.io,
        settings=settings,
        exported=exported,
        **options,
        **extra,
    )


def _conversion_backend(backends: str | Sequence[str]) -> str:
    """TensorRT when it is among the runners and can run here (a named one that cannot is an error later),
    else ONNX Runtime."""
    from pipeline.runtime.tensorrt.identity import tensorrt_status

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
