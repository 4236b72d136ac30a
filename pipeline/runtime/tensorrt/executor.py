"""Executors of the TensorRT backends: an engine built (or taken from the engine cache) and run.

:class:`TensorRTExecutor` runs an engine (built by ``pipeline.backends``, or saved in an artifact) on the GPU with
``pipeline.runtime.tensorrt.runner`` (TensorRT, or TensorRT-RTX with its runtime cache in the cache directory).
:class:`EngineOnOnnxRuntime` is a TensorRT-RTX engine built ahead of time where it cannot run (no CUDA, a GPU
TensorRT-RTX does not support): the engine is kept (module, artifact, engine cache) and the same final graph runs on
ONNX Runtime, as the report says.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import torch

from converters.errors import BuildError
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.tensorrt.library import TENSORRT, TrtLibrary
from pipeline.settings import Settings

if TYPE_CHECKING:
    from pipeline.runtime.ort.executor import OnnxRuntimeExecutor
    from pipeline.runtime.tensorrt.runner import EngineRunner

logger = logging.getLogger(__name__)


def runtime_cache_path(engine: bytes, settings: Settings) -> Path:
    """Where TensorRT-RTX keeps the JIT results for one engine between runs: the cache directory, by engine digest."""
    return Path(settings.cache_dir).expanduser() / f"runtime-rtx-{hashlib.sha256(engine).hexdigest()[:32]}.cache"


class TensorRTExecutor:
    """An engine and the runner that executes it on torch CUDA tensors (see ``pipeline.runtime.tensorrt.runner``)."""

    runs_on = "engine"

    def __init__(
        self,
        engine: bytes,
        io: IOSpec,
        settings: Settings,
        cache_status: str = "not cached",
        library: TrtLibrary = TENSORRT,
        *,
        model: onnx.ModelProto | None = None,
        runtime_cache: Path | None = None,
        refit_at_load: bool = False,
    ) -> None:
        """``model`` is the final graph: a weight-stripped engine (``strip_weights``), or one whose graph was given new
        weights where it could not run (``refit_at_load``), is refit from its weights before it runs.
        ``runtime_cache`` is TensorRT-RTX's runtime cache file (default: the cache directory's for this engine; none
        with ``trt_runtime_cache=False``)."""
        from pipeline.runtime.tensorrt.runner import EngineRunner

        self.backend = library.backend
        self.library = library
        self._engine_bytes = engine
        self.cache_status = cache_status
        self.settings = settings
        self.input_names = [t.name for t in io.inputs]
        self.output_names = [t.name for t in io.outputs]
        refit_at_load = refit_at_load or settings.strip_weights
        if refit_at_load and model is None:
            raise BuildError(
                "a weight-stripped engine (strip_weights=True) needs the final graph to take its weights from",
                fix="load it from its artifact (which keeps the graph), or pass the graph to build_executor",
            )
        if library.rtx and settings.trt_runtime_cache:
            runtime_cache = runtime_cache or runtime_cache_path(engine, settings)
        else:
            runtime_cache = None
        self.runtime_cache_file = runtime_cache  # module.save copies it beside the artifact
        self._runner: EngineRunner = EngineRunner(
            engine,
            allow_host_code=settings.trt_version_compatible,
            library=library,
            runtime_cache=runtime_cache,
            refit_graph=model if refit_at_load else None,
            weight_streaming_budget=settings.weight_streaming_budget,
            cuda_graphs=settings.cuda_graphs,
        )
        self._runner.check_io(io)

    def refit(self, graph: onnx.ModelProto) -> None:
        """Give the engine the weights of ``graph`` (the final graph of the new model, same structure), in place. The
        engine bytes become the refit engine's, except a weight-stripped one's (its weights stay in the graph)."""
        if not self.settings.refittable:
            raise BuildError(
                "the engine was not built refittable, so it cannot take new weights"
                + (" (strip_weights builds it for its own weights only)" if self.settings.strip_weights else ""),
                fix="convert with refittable=True to refit it later, or convert the new model",
            )
        self._runner.refit(graph)
        if not self.settings.strip_weights:
            self._engine_bytes = bytes(self._runner.serialize())

    @property
    def refit_at_load(self) -> bool:
        """Whether the saved engine must be refit from the saved graph when it is loaded (a stripped one is anyway)."""
        return False

    @property
    def engine_runner(self) -> EngineRunner:
        """The engine and its execution context (generation binds the cache buffers on it directly)."""
        return self._runner

    @property
    def engine_bytes(self) -> bytes | None:
        """The serialized engine."""
        return self._engine_bytes

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run the engine on CUDA tensors; the outputs in graph order."""
        outputs = self._runner.run(dict(zip(self.input_names, inputs, strict=True)))
        return [outputs[name] for name in self.output_names]

    def polygraphy_runner(self, name: str) -> Any:
        """Polygraphy's ``TrtRunner`` on the same engine (its own execution context), for validation."""
        from polygraphy.backend.trt import TrtRunner  # bound to this library by the build (bind_polygraphy)

        return TrtRunner(self._runner.engine, name=name)


class EngineOnOnnxRuntime:
    """A TensorRT-RTX engine that cannot run here, kept beside the same final graph running on ONNX Runtime.

    ``engine_bytes`` is the engine (saved in the artifact); ``run`` and ``polygraphy_runner`` are ONNX Runtime's.
    ``reason`` says why the engine does not run here.
    """

    runs_on = "onnxruntime"

    def __init__(
        self,
        engine: bytes,
        model: onnx.ModelProto,
        io: IOSpec,
        settings: Settings,
        reason: str,
        cache_status: str = "not cached",
        library: TrtLibrary = TENSORRT,
    ) -> None:
        from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

        self.backend = library.backend
        self.library = library
        self.reason = reason
        self.cache_status = cache_status
        self.settings = settings
        self._io = io
        self._engine_bytes = engine
        # the engine holds older weights than the graph (a refit here): it is refit from the graph where it is loaded
        self.refit_at_load = False
        # it stands in for the engine: the Q/DQ graph as TensorRT computes it, without ONNX Runtime's requantized
        # convolution outputs (pipeline.runtime.ort.int8, rewrite 0)
        exact = dataclasses.replace(settings, ort_int8_conv_outputs="exact")
        self.onnxruntime: OnnxRuntimeExecutor = OnnxRuntimeExecutor(model, io, exact)

    def refit(self, graph: onnx.ModelProto) -> None:
        """New weights where the engine cannot run: ONNX Runtime runs ``graph``, and the saved engine (unless it is
        weight-stripped, whose weights are the graph's anyway) is recorded to be refit from the saved graph when it
        is loaded where it runs."""
        from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

        if not self.settings.refittable:
            raise BuildError(
                "the engine was not built refittable, so it cannot take new weights",
                fix="convert with refittable=True to refit it later, or convert the new model",
            )
        exact = dataclasses.replace(self.settings, ort_int8_conv_outputs="exact")
        self.onnxruntime = OnnxRuntimeExecutor(graph, self._io, exact)
        self.refit_at_load = not self.settings.strip_weights

    @property
    def engine_bytes(self) -> bytes | None:
        """The engine that was built (saved with the artifact), though it does not run here."""
        return self._engine_bytes

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run the same final graph on ONNX Runtime."""
        return self.onnxruntime.run(inputs)

    def polygraphy_runner(self, name: str) -> Any:
        """ONNX Runtime's runner on the final graph (the engine itself cannot run here)."""
        return self.onnxruntime.polygraphy_runner(name)

    def hold(self, value: Any) -> None:
        """Keep ``value`` (the module's weights directory) alive while ONNX Runtime's session of the graph is made in
        the background (:meth:`~pipeline.runtime.ort.executor.OnnxRuntimeExecutor.hold`): a module dropped during
        that build, as a test's converted TensorRT-RTX module is at its end, removed the weights under it ("External
        data path does not exist", 30 times in one CI run's output)."""
        self.onnxruntime.hold(value)
