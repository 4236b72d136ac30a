"""Backends: which one runs the final graph, and the executors that run it.

``onnxruntime`` is the embedded default and runs anywhere. ``tensorrt`` (NVIDIA TensorRT) and ``tensorrt-rtx``
(TensorRT-RTX) share one build path (``pipeline.backends.tensorrt``) and are imported lazily; ``import pipeline``
works without them. TensorRT-RTX builds engines without a GPU; where its engine cannot run, the engine is still built
and kept, and the same final graph runs on ONNX Runtime: said in a warning and in the report, or an error with
``require_engine_runtime=True``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import onnx
import torch

from converters.errors import BuildError
from pipeline.module.io_spec import IOSpec
from pipeline.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendChoice:
    """The backend that will run the graph and why it was picked (kept in the report). ``runs_engine`` is False for
    a TensorRT-RTX engine that cannot run here (the final graph then runs on ONNX Runtime)."""

    name: str
    reason: str
    runs_engine: bool = True


class Executor(Protocol):
    """A built backend: runs flat graph inputs to flat graph outputs."""

    backend: str

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run the graph on the flat inputs, in graph order; the outputs in graph order."""
        ...

    def polygraphy_runner(self, name: str) -> Any:
        """A Polygraphy runner of the same graph or engine (validation and comparison use it)."""
        ...

    @property
    def engine_bytes(self) -> bytes | None:
        """The serialized engine, or None when the backend has none (ONNX Runtime)."""
        ...


class EngineNotRunnableWarning(UserWarning):
    """A TensorRT-RTX engine was built but cannot run here; the same graph runs on ONNX Runtime."""


def select_backend(requested: str, settings: Settings | None = None) -> BackendChoice:
    """Resolve ``auto``; asking for ``tensorrt`` where it cannot run is an error, never a silent fallback.

    ``tensorrt-rtx`` needs only the library to import: where its engine cannot run (``settings`` give the targets),
    the choice says so, a :class:`EngineNotRunnableWarning` is issued, and ``settings.require_engine_runtime`` makes
    it a BuildError.
    """
    settings = settings or Settings()
    if requested == "onnxruntime":
        choice = BackendChoice("onnxruntime", "requested (backend='onnxruntime')")
    elif requested == "tensorrt-rtx":
        choice = _select_rtx(settings)
    else:
        from pipeline.backends.tensorrt.build import tensorrt_status

        available, why = tensorrt_status()
        if requested == "tensorrt":
            if not available:
                raise BuildError(
                    f"backend='tensorrt' was requested but TensorRT cannot run here: {why}",
                    fix="run where `import tensorrt` works and torch.cuda.is_available() is True (an NVIDIA GPU, "
                    "a CUDA build of torch, pip install 'torch-trt-pipeline[tensorrt]'), or pass "
                    "backend='onnxruntime' to run on the CPU (or backend='tensorrt-rtx' to build a TensorRT-RTX "
                    "engine without a GPU)",
                )
            choice = BackendChoice("tensorrt", f"requested (backend='tensorrt'); {why}")
        elif available:
            choice = BackendChoice("tensorrt", f"auto: {why}")
        else:
            choice = BackendChoice("onnxruntime", f"auto: TensorRT not usable ({why}){_rtx_hint(settings)}")
    logger.info("backend: %s (%s)", choice.name, choice.reason)
    return choice


def _rtx_hint(settings: Settings) -> str:
    """What ``auto`` leaves aside when TensorRT-RTX is installed: it builds an engine here (and runs it where a GPU
    it supports is), chosen with ``backend='tensorrt-rtx'``; empty when it does not import."""
    from pipeline.backends.tensorrt.build import engine_runtime_status
    from pipeline.backends.tensorrt.library import TENSORRT_RTX

    if not TENSORRT_RTX.importable():
        return ""
    runnable, why = engine_runtime_status(TENSORRT_RTX, settings)
    what = "build and run an engine here" if runnable else f"build an engine here for a GPU elsewhere ({why})"
    return f"; TensorRT-RTX {TENSORRT_RTX.version()} can {what}: backend='tensorrt-rtx' (--backend tensorrt-rtx)"


def _select_rtx(settings: Settings) -> BackendChoice:
    from pipeline.backends.tensorrt.build import engine_runtime_status
    from pipeline.backends.tensorrt.library import TENSORRT_RTX, describe_targets

    TENSORRT_RTX.import_module()  # raises with the pip command when it is missing
    runnable, why = engine_runtime_status(TENSORRT_RTX, settings)
    if runnable:
        return BackendChoice("tensorrt-rtx", f"requested (backend='tensorrt-rtx'); {why}")
    targets = describe_targets(settings.trt_compute_capabilities)
    message = (
        f"engine built for {targets} with TensorRT-RTX {TENSORRT_RTX.version()}; not runnable here: {why}; "
        "running the same graph on ONNX Runtime"
    )
    if settings.require_engine_runtime:
        raise BuildError(
            f"backend='tensorrt-rtx' with require_engine_runtime=True, but the engine cannot run here: {why}",
            fix="run on a GPU TensorRT-RTX supports (compute capability 8.0, 8.6, 8.9, 12.0 or later; 7.5 when "
            "targeted) and target it (trt_compute_capabilities), or drop require_engine_runtime to build the engine "
            "and run the same graph on ONNX Runtime",
        )
    warnings.warn(message, EngineNotRunnableWarning, stacklevel=3)
    return BackendChoice("tensorrt-rtx", f"requested (backend='tensorrt-rtx'); {message}", runs_engine=False)


def build_executor(
    backend: str,
    model: onnx.ModelProto,
    io: IOSpec,
    settings: Settings,
    engine: bytes | None = None,
    static_check: Callable[[onnx.ModelProto], Mapping[str, str]] | None = None,
    *,
    runtime_cache: Path | None = None,
    refit_at_load: bool = False,
) -> Executor:
    """Build (or, given ``engine`` bytes, load) the executor for ``backend``.

    ``static_check`` (node name -> why TensorRT's parser will reject it) is asked only when TensorRT's parser
    rejects the graph; its reasons are reported beside the parser's for each node. A TensorRT-RTX engine that cannot
    run here is built (or taken as given) and kept, and the graph runs on ONNX Runtime (``EngineOnOnnxRuntime``).
    ``runtime_cache`` is where TensorRT-RTX keeps its JIT results (default: the cache directory); ``refit_at_load``
    says the given engine is refit from ``model``'s weights before it runs (``pipeline.backends.tensorrt.weights``).
    """
    if backend == "onnxruntime":
        from pipeline.backends.onnxruntime import OnnxRuntimeExecutor

        return OnnxRuntimeExecutor(model, io, settings)
    if backend in ("tensorrt", "tensorrt-rtx"):
        from pipeline.backends.tensorrt.build import engine_runtime_status
        from pipeline.backends.tensorrt.executor import EngineOnOnnxRuntime, TensorRTExecutor, cached_engine
        from pipeline.backends.tensorrt.library import library_for

        library = library_for(backend)
        runnable, why = engine_runtime_status(library, settings) if library.rtx else (True, "")
        if runnable:
            if engine is None:
                return TensorRTExecutor.build(model, io, settings, static_check, library)
            return TensorRTExecutor(
                engine, io, settings, library=library, model=model, runtime_cache=runtime_cache,
                refit_at_load=refit_at_load,
            )
        status = "loaded"
        if engine is None:
            engine, status = cached_engine(model, io, settings, static_check, library)
        executor = EngineOnOnnxRuntime(engine, model, io, settings, why, status, library)
        executor.refit_at_load = refit_at_load  # still owed: the engine's weights are older than the graph's
        return executor
    raise BuildError(f"unknown backend {backend!r}", fix="use 'onnxruntime', 'tensorrt' or 'tensorrt-rtx'")
