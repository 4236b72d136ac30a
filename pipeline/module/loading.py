"""``pipeline.load``: an artifact written by ``ConvertedModule.save`` back to a module.

It sits above :mod:`pipeline.module.converted` (it makes a ``ConvertedModule``), which is why it is not beside
``save_artifact`` in :mod:`pipeline.module.artifact`: the module's ``save`` calls that one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from converters.errors import ArtifactError
from pipeline.backends import Executor, build_executor, select_backend
from pipeline.backends.plugin_runtime import restore_plugins
from pipeline.generation.module import module_class
from pipeline.module.artifact import Artifact, read_artifact, runtime_cache_beside
from pipeline.module.converted import ConvertedModule
from pipeline.module.report import ConversionReport
from pipeline.settings import Settings


def load(path: str | Path, *, backend: str | None = None, rebuild: bool = False) -> ConvertedModule:
    """Load an artifact written by ``ConvertedModule.save``.

    ``backend=None`` uses the artifact's backend; ``backend="onnxruntime"`` runs its ONNX graph on the CPU even
    when it holds a TensorRT engine. ``rebuild=True`` builds a new engine when the saved one was made for another
    TensorRT version or GPU.
    """
    artifact = read_artifact(path)
    settings, io = artifact.settings, artifact.io
    chosen = backend or artifact.metadata["backend"]
    engine = None
    if chosen == "tensorrt":
        engine = _usable_engine(artifact.engine, artifact.metadata.get("engine", {}), Path(path), rebuild, settings)
    elif chosen == "tensorrt-rtx" and not rebuild:
        engine = artifact.engine  # runs where TensorRT-RTX supports the GPU, else kept beside ONNX Runtime
    # raises with the reason when TensorRT was asked for and cannot run; warns when a TensorRT-RTX engine cannot
    choice = select_backend(chosen, settings)
    # the torch ops behind plugin nodes, re-imported; TensorRT's plugins registered before the engine is read
    restore_plugins(artifact.metadata.get("plugins", ()), artifact.onnx_model, chosen)
    plan = artifact.metadata.get("segments")
    executor: Executor
    if plan is not None and chosen in ("tensorrt", "tensorrt-rtx"):  # TensorRT segments, ONNX Runtime for the rest
        executor = _segmented(chosen, artifact, Path(path), rebuild, settings, plan)
    else:
        executor = build_executor(
            chosen,
            artifact.onnx_model,
            io,
            settings,
            engine=engine,
            runtime_cache=runtime_cache_beside(Path(path)) if chosen == "tensorrt-rtx" else None,
            refit_at_load=bool(artifact.metadata.get("engine", {}).get("refit_at_load", False)) and engine is not None,
        )
    report = ConversionReport.from_dict(artifact.metadata["report"])
    if chosen == "tensorrt-rtx":  # where its engine runs is this machine's answer, not the converting one's
        report = dataclasses.replace(report, backend_reason=choice.reason)
    return module_class(settings)(executor, io, artifact.onnx_model, settings, report, artifact.weights)


def _segmented(
    backend: str, artifact: Artifact, path: Path, rebuild: bool, settings: Settings, plan: list[dict[str, Any]]
) -> Executor:
    """The saved segments with their saved engines (checked against this machine as a whole engine is), or with
    engines built anew (``rebuild``)."""
    from pipeline.backends.segments.executor import PlannedSegment, SegmentedExecutor

    engines = {} if rebuild else dict(artifact.segment_engines)
    if backend == "tensorrt" and engines:
        first = next(iter(engines.values()))
        _usable_engine(first, artifact.metadata.get("engine", {}), path, rebuild, settings)
    segments = [PlannedSegment.from_json(p) for p in plan]
    return SegmentedExecutor.from_plan(backend, artifact.onnx_model, artifact.io, settings, segments, engines)


def _usable_engine(
    engine: bytes | None, built_for: dict[str, str], path: Path, rebuild: bool, settings: Settings
) -> bytes | None:
    """The saved engine if it can run with this TensorRT and GPU; None (build anew) if ``rebuild``."""
    if engine is None or rebuild:
        return None
    from pipeline.backends.tensorrt.build import device_identity, engine_mismatch, tensorrt_status

    available, why = tensorrt_status()
    if not available:
        raise ArtifactError(
            f"{path} holds a TensorRT engine but TensorRT cannot run here: {why}",
            fix="load it with backend='onnxruntime' to run its ONNX graph on the CPU",
        )
    mismatch = engine_mismatch(built_for, device_identity(), settings)
    if mismatch is not None:
        raise ArtifactError(
            f"{path} holds an engine that cannot run here: {mismatch}",
            fix="load it with rebuild=True to build a new engine from the saved ONNX graph",
        )
    return engine
