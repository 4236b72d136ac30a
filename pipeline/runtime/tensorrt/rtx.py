"""What only TensorRT-RTX has: the runtime cache of just-in-time compiled kernels, and CUDA graphs it captures.

A TensorRT-RTX engine is built ahead of time for a set of compute capabilities and specialised to the GPU at the
first run of each shape; the runtime cache (``IRuntimeCache``) keeps those results in a file of the cache directory,
so later processes skip the compilation. Untested without a supported GPU; its names are checked against the real
TensorRT-RTX 1.7 bindings (tests/pipeline/test_tensorrt_api.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.files import write_file_atomically
from pipeline.runtime.tensorrt.library import TENSORRT_RTX

if TYPE_CHECKING:
    import tensorrt_rtx as trt_rtx

logger = logging.getLogger(__name__)


class RuntimeCache:
    """The runtime config of one engine: its runtime cache, read from ``path`` (when it exists) and written back after
    new shapes ran (``path=None``: no cache), and TensorRT-RTX's own CUDA graph capture with ``cuda_graphs``."""

    def __init__(self, engine: trt_rtx.ICudaEngine, path: Path | None, *, cuda_graphs: bool = False) -> None:
        tensorrt_rtx = TENSORRT_RTX.import_module()
        self.engine = engine
        self.path = path
        self.config: trt_rtx.IRuntimeConfig = engine.create_runtime_config()
        if cuda_graphs:
            self.config.cuda_graph_strategy = tensorrt_rtx.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
        self.cache: trt_rtx.IRuntimeCache | None = None
        if path is not None:
            self.cache = self.config.create_runtime_cache()
            if path.is_file() and not self.cache.deserialize(path.read_bytes()):
                logger.warning("TensorRT-RTX runtime cache %s could not be read; it will be rebuilt", path)
            self.config.set_runtime_cache(self.cache)
        self._saved: set[Any] = set()

    def create_execution_context(self) -> Any:
        """An execution context that uses (and fills) the runtime cache."""
        return self.engine.create_execution_context(self.config)

    def save_if_new(self, shapes: Any) -> None:
        """Write the cache after the first run of these input shapes (when kernels were compiled for them)."""
        if self.cache is None or self.path is None or shapes in self._saved:
            return
        self._saved.add(shapes)
        data = self.cache.serialize()
        if data is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomically(self.path, bytes(data))
