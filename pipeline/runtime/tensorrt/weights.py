"""Engine options about weights: weight-stripped and refittable engines, refit from a graph, weight streaming.

- ``strip_weights=True`` builds with ``STRIP_PLAN`` and ``REFIT_IDENTICAL`` (``STRIP_PLAN`` and ``REFIT`` with
  ``refittable=True``): the plan holds no refittable weights, and the engine is refit from the final graph's
  initializers when it is loaded (:func:`refit_from_graph`, ``OnnxParserRefitter`` then ``Refitter``), before its
  first run. The artifact and the engine cache hold the weights once, in the ONNX graph.
- ``refittable=True`` builds with ``REFIT``: ``pipeline.refit(module, new_model)`` replaces the weights of the engine.
  ``REFIT_IDENTICAL`` lets the builder fold the weights it was given into its kernels, so a stripped engine that is
  not ``refittable`` can only be given those same weights back.
- ``weight_streaming_budget`` builds with ``WEIGHT_STREAMING`` and, at load, sets the engine's budget (the bytes
  of weights kept on the GPU; -1 asks TensorRT for its automatic budget) before the execution context is made.
- ``sparse_weights=True`` sets ``SPARSE_WEIGHTS`` (TensorRT may pick 2:4-sparse kernels for weights that are).

The flags are set on the builder config here (TensorRT-RTX builds them on this machine, in the tests); the refit and
the budget need a deserialized engine, so a GPU: their names are checked against TensorRT 10.16, 11.4 and
TensorRT-RTX 1.7 (tests/pipeline/test_tensorrt_api.py), see ``pipeline.backends.tensorrt.build`` for the conventions.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from converters.errors import BuildError
from passes.model_io.external_data import base_dir_of
from pipeline.runtime.tensorrt.library import TENSORRT, TrtLibrary
from pipeline.settings import Settings

if TYPE_CHECKING:
    import tensorrt as trt

logger = logging.getLogger(__name__)


def weight_flag_names(settings: Settings) -> list[str]:
    """The builder flags the weight options ask for, by name (for the report and the tests)."""
    names = []
    if settings.refittable:
        names.append("REFIT")
    elif settings.strip_weights:
        names.append("REFIT_IDENTICAL")
    if settings.strip_weights:
        names.append("STRIP_PLAN")
    if settings.weight_streaming_budget is not None:
        names.append("WEIGHT_STREAMING")
    if settings.sparse_weights:
        names.append("SPARSE_WEIGHTS")
    return names


def set_weight_flags(config: trt.IBuilderConfig, settings: Settings, library: TrtLibrary = TENSORRT) -> None:
    """Set the builder flags of :func:`weight_flag_names` on ``config`` (a Polygraphy ``PostprocessConfig`` step)."""
    tensorrt = library.import_module()
    flags = {
        "REFIT": tensorrt.BuilderFlag.REFIT,
        "REFIT_IDENTICAL": tensorrt.BuilderFlag.REFIT_IDENTICAL,
        "STRIP_PLAN": tensorrt.BuilderFlag.STRIP_PLAN,
        "WEIGHT_STREAMING": tensorrt.BuilderFlag.WEIGHT_STREAMING,
        "SPARSE_WEIGHTS": tensorrt.BuilderFlag.SPARSE_WEIGHTS,
    }
    for name in weight_flag_names(settings):
        config.set_flag(flags[name])


def refit_build_error(settings: Settings, library: TrtLibrary) -> BuildError | None:
    """The error for a failed TensorRT-RTX build of a refittable or weight-stripped engine without a CUDA device: its
    CPU-only builder (1.7.1) refuses them (``MyelinCheckException ... graph_jit.cpp:278: CHECK(status ==
    CUDA_SUCCESS)``, measured on this project's machines) while it builds the same graph without those flags. None
    when that is not the case (the caller reports the builder's own error)."""
    import torch

    refit = {"REFIT", "REFIT_IDENTICAL", "STRIP_PLAN"} & set(weight_flag_names(settings))
    if not library.rtx or not refit or torch.cuda.is_available():
        return None
    return BuildError(
        f"{library.title} {library.version()} cannot build a refittable or weight-stripped engine without a CUDA "
        f"device (flags {sorted(refit)}; its CPU-only builder fails in Myelin's JIT, see the log above)",
        fix="build on a machine with an NVIDIA GPU and driver, or convert without strip_weights and refittable "
        "(pipeline.refit and the weights-once artifact then work on ONNX Runtime only)",
    )


def refit_from_graph(
    engine: trt.ICudaEngine, model: onnx.ModelProto, library: TrtLibrary = TENSORRT, base_dir: Path | None = None
) -> None:
    """Give ``engine`` (built ``refittable`` or ``strip_weights``) the weights of ``model``, the final graph it was
    built from or one of the same structure: TensorRT's ``OnnxParserRefitter`` reads them, ``Refitter`` applies them.

    A graph whose weights do not fit the engine (another structure, a missing weight) is a BuildError naming them.
    ``base_dir`` is where external weights live (default: the pipeline's weights directory of the graph).
    """
    tensorrt = library.import_module()
    from polygraphy.backend.trt import get_trt_logger  # the runtime's logger (bound to ``library`` by its runner)

    if not engine.refittable:
        raise BuildError(
            "the engine was built without refittable weights, so it cannot take the graph's weights",
            fix="convert with refittable=True (new weights) or strip_weights=True (weights kept once, in the graph)",
        )
    log = get_trt_logger()
    refitter: trt.Refitter = tensorrt.Refitter(engine, log)
    parser: trt.OnnxParserRefitter = tensorrt.OnnxParserRefitter(refitter, log)
    base_dir = base_dir or base_dir_of(model)
    path = None if base_dir is None else str(base_dir / "model.onnx")  # the parser finds external weights beside it
    if not parser.refit_from_bytes(model.SerializeToString(), path):
        errors = []
        for index in range(parser.num_errors):
            error: trt.ParserError = parser.get_error(index)
            errors.append(f"{error.node_name() or 'graph'}: {error.desc()}")
        raise BuildError(
            f"{library.title}'s ONNX refitter could not read the graph's weights: {'; '.join(errors) or 'no reason'}",
            fix="refit from a graph of the same structure as the one the engine was built from (pipeline.refit "
            "converts the new model through the same passes), or convert again",
        )
    missing = [name or "(unnamed)" for name in refitter.get_missing_weights()]
    if missing or not refitter.refit_cuda_engine():
        raise BuildError(
            f"{library.title} could not refit the engine" + (f": weights missing: {missing[:10]}" if missing else ""),
            fix="the graph's weights must have the names, shapes and types the engine was built with: convert again",
        )
    logger.info("engine refit from the graph's weights")


def set_weight_streaming_budget(engine: trt.ICudaEngine, budget: int) -> int:
    """Keep ``budget`` bytes of the engine's streamable weights on the GPU (-1: TensorRT's automatic budget), before
    any execution context is made; the budget set. An engine built without weight streaming is a BuildError."""
    if engine.streamable_weights_size <= 0:
        raise BuildError(
            "weight_streaming_budget was given but the engine has no streamable weights (it was built without "
            "weight streaming, or every weight is needed on the GPU)",
            fix="convert again with weight_streaming_budget set (it builds with weight streaming), or drop the budget",
        )
    if budget == -1:
        budget = engine.get_weight_streaming_automatic_budget()
    engine.weight_streaming_budget_v2 = budget
    logger.info("weight streaming: %d of %d bytes of weights on the GPU", budget, engine.streamable_weights_size)
    return budget


def describe(settings: Settings) -> dict[str, Any] | None:
    """The engine options in effect, for the report (None when every one is off): the builder flags, where the
    weights are, the streaming budget, CUDA graphs, TensorRT-RTX's runtime cache."""
    record: dict[str, Any] = {
        "flags": weight_flag_names(settings),
        "weights": "graph (refit at load)" if settings.strip_weights else "plan",
        "weight_streaming_budget": settings.weight_streaming_budget,
        "cuda_graphs": settings.cuda_graphs,
    }
    if not record["flags"] and not settings.cuda_graphs:
        return None
    return record
