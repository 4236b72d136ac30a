"""Backends: which one runs the final graph, and the executors that run it.

``onnxruntime`` is the embedded default and runs anywhere. ``tensorrt`` is imported lazily, only from
``pipeline.backends.tensorrt.build``; ``import pipeline`` works without it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import onnx
import torch

from converters.errors import BuildError
from converters.settings import Settings
from pipeline.module.io_spec import IOSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendChoice:
    """The backend that will run the graph and why it was picked (kept in the report)."""

    name: str
    reason: str


class Executor(Protocol):
    """A built backend: runs flat graph inputs to flat graph outputs."""

    backend: str

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]: ...

    def polygraphy_runner(self, name: str) -> Any: ...

    @property
    def engine_bytes(self) -> bytes | None: ...


def select_backend(requested: str) -> BackendChoice:
    """Resolve ``auto``; asking for ``tensorrt`` where it cannot run is an error, never a silent fallback."""
    if requested == "onnxruntime":
        choice = BackendChoice("onnxruntime", "requested (backend='onnxruntime')")
    else:
        from pipeline.backends.tensorrt.build import tensorrt_status

        available, why = tensorrt_status()
        if requested == "tensorrt":
            if not available:
                raise BuildError(
                    f"backend='tensorrt' was requested but TensorRT cannot run here: {why}",
                    fix="run where `import tensorrt` works and torch.cuda.is_available() is True (an NVIDIA GPU, "
                    "a CUDA build of torch, pip install 'torch-trt-pipeline[tensorrt]'), or pass "
                    "backend='onnxruntime' to run on the CPU",
                )
            choice = BackendChoice("tensorrt", f"requested (backend='tensorrt'); {why}")
        elif available:
            choice = BackendChoice("tensorrt", f"auto: {why}")
        else:
            choice = BackendChoice("onnxruntime", f"auto: TensorRT not usable ({why})")
    logger.info("backend: %s (%s)", choice.name, choice.reason)
    return choice


def build_executor(
    backend: str,
    model: onnx.ModelProto,
    io: IOSpec,
    settings: Settings,
    engine: bytes | None = None,
    static_check: Callable[[onnx.ModelProto], Mapping[str, str]] | None = None,
) -> Executor:
    """Build (or, given ``engine`` bytes, load) the executor for ``backend``.

    ``static_check`` (node name -> why TensorRT's parser will reject it) is asked only when TensorRT's parser
    rejects the graph; its reasons are reported beside the parser's for each node.
    """
    if backend == "onnxruntime":
        from pipeline.backends.onnxruntime import OnnxRuntimeExecutor

        return OnnxRuntimeExecutor(model, io, settings)
    if backend == "tensorrt":
        from pipeline.backends.tensorrt.build import TensorRTExecutor

        if engine is None:
            return TensorRTExecutor.build(model, io, settings, static_check)
        return TensorRTExecutor(engine, io, settings)
    raise BuildError(f"unknown backend {backend!r}", fix="use 'onnxruntime' or 'tensorrt'")
