"""Executors: which backend runs a graph, and the executor that runs it from a graph and (TensorRT) a saved engine.

``onnxruntime`` is the embedded default and runs anywhere. ``tensorrt`` (NVIDIA TensorRT) and ``tensorrt-rtx``
(TensorRT-RTX) are imported lazily; ``import pipeline`` works without them. Where a TensorRT-RTX engine cannot run,
it is kept and the same final graph runs on ONNX Runtime: said in a warning and in the report, or an error with
``require_engine_runtime=True``. Building an engine is conversion work (:func:`pipeline.backends.build_executor`);
this module only loads what was built.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import onnx

from converters.errors import BuildError
from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import Settings

if TYPE_CHECKING:
    import torch

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


def select_backend(requested: str, settings: Settings | None = None, *, quiet: bool = False) -> BackendChoice:
    """Resolve ``auto``; asking for ``tensorrt`` where it cannot run is an error, never a silent fallback.

    ``tensorrt-rtx`` needs only the library to import: where its engine cannot run (``settings`` give the targets),
    the choice says so, a :class:`EngineNotRunnableWarning` is issued, and ``settings.require_engine_runtime`` makes
    it a BuildError. The choice is logged (INFO), once per graph a conversion builds; ``quiet``: a question a pass
    asks of it (which backend the graph is lowered for) logs at DEBUG and warns nothing, the errors stand.
    """
    settings = settings or Settings()
    if requested == "onnxruntime":
        choice = BackendChoice("onnxruntime", "requested (backend='onnxruntime')")
    elif requested == "tensorrt-rtx":
        choice = _select_rtx(settings, quiet)
    else:
        from pipeline.runtime.tensorrt.identity import tensorrt_status

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
    logger.log(logging.DEBUG if quiet else logging.INFO, "backend: %s (%s)", choice.name, choice.reason)
    return choice


def _rtx_hint(settings: Settings) -> str:
    """What ``auto`` leaves aside when TensorRT-RTX is installed: it builds an engine here (and runs it where a GPU
    it supports is), chosen with ``backend='tensorrt-rtx'``; empty when it does not import."""
    from pipeline.runtime.tensorrt.identity import engine_runtime_status
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX

    if not TENSORRT_RTX.importable():
        return ""
    runnable, why = engine_runtime_status(TENSORRT_RTX, settings)
    what = "build and run an engine here" if runnable else f"build an engine here for a GPU elsewhere ({why})"
    return f"; TensorRT-RTX {TENSORRT_RTX.version()} can {what}: backend='tensorrt-rtx' (--backend tensorrt-rtx)"


def _select_rtx(settings: Settings, quiet: bool = False) -> BackendChoice:
    from pipeline.runtime.tensorrt.identity import engine_runtime_status
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX, describe_targets

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
    if not quiet:
        warnings.warn(message, EngineNotRunnableWarning, stacklevel=3)
    return BackendChoice("tensorrt-rtx", f"requested (backend='tensorrt-rtx'); {message}", runs_engine=False)


def load_executor(
    backend: str,
    model: onnx.ModelProto,
    io: IOSpec,
    settings: Settings,
    engine: bytes | None = None,
    *,
    status: str = "loaded",
    runtime_cache: Path | None = None,
    refit_at_load: bool = False,
    prepared: onnx.ModelProto | None = None,
) -> Executor:
    """The executor of ``backend`` for ``model``, from a built ``engine`` (TensorRT, TensorRT-RTX); never builds.

    A TensorRT-RTX engine that cannot run here is kept and the graph runs on ONNX Runtime (``EngineOnOnnxRuntime``).
    ``status`` is how the engine was had (``"loaded"``, ``"built"``, ``"hit"``: the engine cache's word);
    ``runtime_cache`` is where TensorRT-RTX keeps its JIT results (default: the cache directory); ``refit_at_load``
    says the engine is refit from ``model``'s weights before it runs (``pipeline.runtime.tensorrt.weights``);
    ``prepared`` is ONNX Runtime's session graph of ``model`` already made (an artifact's, stored at save time).
    """
    if backend == "onnxruntime":
        from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

        return OnnxRuntimeExecutor(model, io, settings, prepared=prepared)
    if backend not in ("tensorrt", "tensorrt-rtx"):
        raise BuildError(f"unknown backend {backend!r}", fix="use 'onnxruntime', 'tensorrt' or 'tensorrt-rtx'")
    if engine is None:
        raise BuildError(
            f"backend {backend!r} needs an engine and none was given",
            fix="build one with pipeline.convert (or pipeline.load(path, rebuild=True) for a saved graph)",
        )
    from pipeline.runtime.tensorrt.executor import EngineOnOnnxRuntime, TensorRTExecutor
    from pipeline.runtime.tensorrt.identity import engine_runtime_status
    from pipeline.runtime.tensorrt.library import library_for

    library = library_for(backend)
    runnable, why = engine_runtime_status(library, settings) if library.rtx else (True, "")
    if runnable:
        return TensorRTExecutor(
            engine,
            io,
            settings,
            status,
            library,
            model=model,
            runtime_cache=runtime_cache,
            refit_at_load=refit_at_load,
        )
    executor = EngineOnOnnxRuntime(engine, model, io, settings, why, status, library)
    executor.refit_at_load = refit_at_load  # still owed: the engine's weights are older than the graph's
    return executor


#: ``build_executor``'s signature: what the runtime calls to build an engine it lacks (``pipeline.load(path,
#: rebuild=True)``, segments without their engines); the conversion layer passes
#: :func:`pipeline.backends.build_executor`.
ExecutorBuilder = Callable[..., Executor]
