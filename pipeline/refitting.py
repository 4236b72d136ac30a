"""``pipeline.refit(module, new_model_or_state_dict)``: new weights for a converted module, without building anew.

The new model goes through the stages that made the module's final graph (export, the same passes, the precision or
quantize stage with the same settings: ``pipeline.final_graph``); its final graph must have the structure of the
module's (the same nodes, attributes and initializer names, shapes and types), only the weights may differ. Then the
backend takes the new weights: ONNX Runtime runs a session of the new graph; a TensorRT engine built ``refittable``
is refit in place (``OnnxParserRefitter`` then ``Refitter``, ``pipeline.runtime.tensorrt.weights``); a TensorRT-RTX
engine that cannot run here keeps its plan, refit from the saved graph where it is loaded. The result is validated
against the new PyTorch model as ``convert`` validates (``validate=False`` skips it).

>>> module = pipeline.convert(model, sample, refittable=True)              # doctest: +SKIP
>>> pipeline.refit(module, finetuned_model)  # or finetuned_model.state_dict()  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import torch
from onnx import helper

from converters.errors import BuildError, ConversionError, InputError
from converters.registry import ConverterRegistry
from passes import GraphPass
from pipeline.backends import build_executor
from pipeline.final_graph import FinalGraph, final_graph, stage_timer, validate_executor
from pipeline.runtime.executors import Executor
from pipeline.runtime.module import ConvertedModule
from pipeline.settings import Settings


@dataclass(frozen=True)
class RefitSource:
    """What ``convert`` used besides the settings, kept for a refit: a weak reference to the model (a state dict is
    loaded into a copy of it while it lives), the sample, the converters, the pass list and the exporter's
    translation table. A loaded module has none of these: it is refit from a new model and ``sample=``."""

    model: weakref.ReferenceType[torch.nn.Module] | None = None
    sample: Any = None
    converters: ConverterRegistry | None = None
    passes: tuple[GraphPass, ...] | None = None
    translations: dict[Any, Any] | None = None


def refit(
    module: ConvertedModule,
    new_model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
    sample: Any = None,
    *,
    calibration: Iterable[Any] | None = None,
) -> ConvertedModule:
    """Give ``module`` the weights of a model of the same architecture (or a state dict of the converted model),
    without building anew; returns the module itself.

    The new model goes through the same export, passes and precision stage (``sample``: the one ``convert`` was
    given, required for a loaded module; ``calibration`` as for ``convert``); its final graph must differ from the
    module's in its weights only. ONNX Runtime then runs the new graph, a TensorRT engine built with
    ``refittable=True`` is refit in place, and the result is validated against the new model unless the module was
    converted with ``validate=False`` (``module.report.accuracy`` is the new validation). New weights with NaN or
    inf (a buffer: NaN) are an InputError naming the tensors, raised before any stage runs.
    """
    from converters.defaults import default_registry
    from passes import default_passes

    if not isinstance(module, ConvertedModule):
        raise InputError(
            f"pipeline.refit takes a converted module first, got {type(module).__name__}",
            fix="pipeline.refit(module, new_model_or_state_dict, sample=...)",
        )
    executor, old_final, report, settings = module.executor, module.onnx, module.report, module.settings
    source = module.conversion_source if isinstance(module.conversion_source, RefitSource) else RefitSource()
    new = new_model_or_state_dict

    if settings.generation is not None:  # the step graph is made from the model (generation/)
        raise InputError(
            "pipeline.refit does not yet refit a generation module (its graph is the cached decoder step made from "
            "the model, which refit does not rebuild)",
            fix="convert the new model again (pipeline.convert(new_model, sample, generation=...))",
        )
    if hasattr(executor, "refit") and not settings.refittable:  # a TensorRT engine: said before any stage runs
        raise BuildError(
            "the engine was not built refittable, so it cannot take new weights"
            + (" (strip_weights builds it for its own weights only)" if settings.strip_weights else ""),
            fix="convert with refittable=True to refit it later, or convert the new model",
        )
    model = _new_model(new, source)
    _check_finite(model)
    sample = source.sample if sample is None else sample
    if sample is None:
        raise InputError(
            "pipeline.refit needs a sample to export the new model with: this module was loaded, not converted here",
            fix="pass sample=... (an input like the one it was converted with): "
            "pipeline.refit(module, new_model, sample=x)",
        )
    registry = source.converters or default_registry()
    pass_list = source.passes if source.passes is not None else default_passes(registry)
    stages: list[tuple[str, float]] = []
    graph = final_graph(model, sample, settings, registry, pass_list, calibration, stages, source.translations)
    difference = structure_difference(old_final, graph.final)
    if difference is not None:
        raise ConversionError(
            f"refit: the new model's final graph differs from the converted one in more than its weights: {difference}",
            fix="refit only with a model of the same architecture and configuration (the same precision decisions: "
            "pass keep_fp32 to pin them); otherwise convert the new model",
        )
    with stage_timer("refit", stages):
        executor = _refit_executor(executor, graph, settings)
    accuracy = report.accuracy
    if settings.validate:
        with stage_timer("validate", stages):
            accuracy = validate_executor(model, sample, graph, executor.polygraphy_runner(executor.backend))
    report = dataclasses.replace(
        report,
        stages=tuple(stages),
        passes=tuple(graph.records),
        accuracy=accuracy,
        precision=graph.precision,
        quantization=graph.quantization,
    )
    module.rebind(executor, graph.final, report, graph.exported.weights)
    return module


def _new_model(new: torch.nn.Module | Mapping[str, torch.Tensor], source: RefitSource) -> torch.nn.Module:
    if isinstance(new, torch.nn.Module):
        return new
    if not isinstance(new, Mapping):
        raise InputError(
            f"pipeline.refit takes an nn.Module or a state dict, got {type(new).__name__}",
            fix="pass the model with the new weights, or its state_dict()",
        )
    original = source.model() if source.model is not None else None
    if original is None:
        raise InputError(
            "pipeline.refit was given a state dict, but the model it was converted from is gone (or the module was "
            "loaded from an artifact), so there is no model to load it into",
            fix="pass the model with the new weights instead: "
            "pipeline.refit(module, model_with_new_weights, sample=...)",
        )
    model = copy.deepcopy(original)
    try:
        model.load_state_dict(dict(new), strict=True)
    except RuntimeError as exc:
        raise InputError(
            f"pipeline.refit: the state dict does not fit the converted model: {exc}",
            fix="pass a state dict of the same architecture (the same keys and shapes as model.state_dict())",
        ) from exc
    return model


def _check_finite(model: torch.nn.Module) -> None:
    """New weights with NaN or inf would make every output NaN, and NaN compares equal to NaN: refuse them, naming
    the parameters, before any stage runs. Buffers are checked for NaN only (an attention mask of -inf is a buffer
    a model may hold on purpose)."""
    found: list[tuple[str, int, int]] = []
    tensors: list[tuple[str, torch.Tensor, bool]] = [(name, p, True) for name, p in model.named_parameters()]
    tensors += [(name, b, False) for name, b in model.named_buffers()]
    for name, tensor, parameter in tensors:
        if not tensor.is_floating_point() and not tensor.is_complex():
            continue
        with torch.no_grad():
            bad = ~torch.isfinite(tensor) if parameter else torch.isnan(tensor)
            count = int(bad.sum())
        if count:
            found.append((name, count, tensor.numel()))
    if found:
        listed = ", ".join(f"{name} ({count} of {total})" for name, count, total in found[:8])
        more = f" and {len(found) - 8} more" if len(found) > 8 else ""
        total = sum(count for _, count, _ in found)
        raise InputError(
            f"pipeline.refit: the new weights hold {total} non-finite (NaN or inf) value(s), in {len(found)} "
            f"tensor(s): {listed}{more}; every output would be NaN or inf",
            fix="check the checkpoint (a diverged fine-tune, a bad load or cast) and pass finite weights; the module "
            "keeps its current ones",
        )


def _refit_executor(executor: Executor, graph: FinalGraph, settings: Settings) -> Executor:
    """ONNX Runtime: a session of the new graph. TensorRT segments: the same segments, their engines built anew.
    TensorRT (and a TensorRT-RTX engine kept beside ONNX Runtime): its ``refit``, which refuses an engine that was
    not built refittable."""
    rebuilt = getattr(executor, "rebuilt", None)  # TensorRT segments: the same segments over the new graph
    if rebuilt is not None:
        return rebuilt(graph.final, settings, build_executor)
    refit_method = getattr(executor, "refit", None)
    if refit_method is None:
        return build_executor(executor.backend, graph.final, graph.io, settings)
    refit_method(graph.final)
    return executor


def structure_difference(old: onnx.ModelProto, new: onnx.ModelProto) -> str | None:
    """Where two final graphs differ in more than their weights (initializer values, Constant node values), or
    None: graph inputs and outputs, each node's op, inputs, outputs and attributes, each initializer's name, shape
    and type."""
    a, b = old.graph, new.graph
    for kind, left, right in (("inputs", a.input, b.input), ("outputs", a.output, b.output)):
        if [v.SerializeToString() for v in left] != [v.SerializeToString() for v in right]:
            return f"the graph {kind} differ: {[v.name for v in left]} vs {[v.name for v in right]}"
    if len(a.node) != len(b.node):
        return f"{len(a.node)} nodes were converted, the new model has {len(b.node)}"
    for old_node, new_node in zip(a.node, b.node, strict=True):
        if _node_signature(old_node) != _node_signature(new_node):
            return f"node {old_node.name!r} ({old_node.op_type}) became {new_node.name!r} ({new_node.op_type}) " + (
                "with other inputs, outputs or attributes"
            )
    old_weights, new_weights = _initializer_signatures(a.initializer), _initializer_signatures(b.initializer)
    if old_weights != new_weights:
        changed = sorted(set(old_weights.items()) ^ set(new_weights.items()))
        return f"the initializers differ in name, shape or type: {[name for name, _ in changed][:10]}"
    return None


def _node_signature(node: onnx.NodeProto) -> tuple[Any, ...]:
    attributes: list[tuple[Any, ...]] = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR:  # a Constant's value: a weight, compared by shape and type
            attributes.append((attribute.name, tuple(attribute.t.dims), attribute.t.data_type))
        else:
            attributes.append((attribute.name, helper.get_attribute_value(attribute)))
    return node.op_type, node.domain, tuple(node.input), tuple(node.output), repr(attributes)


def _initializer_signatures(initializers: Sequence[onnx.TensorProto]) -> dict[str, tuple[Any, ...]]:
    return {t.name: (tuple(t.dims), t.data_type) for t in initializers}
