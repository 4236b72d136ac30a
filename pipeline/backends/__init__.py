"""Backends: building the executor that runs the final graph (the engine build of TensorRT and TensorRT-RTX, through
Polygraphy's loaders, with the engine cache); loading one that was built is the runtime's
(:mod:`pipeline.runtime.executors`). ``import pipeline`` works without TensorRT.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import onnx

from pipeline.runtime.executors import Executor, load_executor
from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import Settings


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
    says the given engine is refit from ``model``'s weights before it runs (``pipeline.runtime.tensorrt.weights``).
    """
    if engine is None and backend in ("tensorrt", "tensorrt-rtx"):
        from pipeline.backends.tensorrt.build import cached_engine
        from pipeline.runtime.tensorrt.library import library_for

        engine, status = cached_engine(model, io, settings, static_check, library_for(backend))
        return load_executor(backend, model, io, settings, engine, status=status)
    return load_executor(backend, model, io, settings, engine, runtime_cache=runtime_cache, refit_at_load=refit_at_load)
