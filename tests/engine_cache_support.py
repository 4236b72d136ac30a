"""What the engine cache's tests share: fake engines of known sizes stored and dated, and a model whose weights live
in an external file (``tests/pipeline/test_engine_cache_*.py``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.backends.tensorrt.engine_cache import EngineCache

LOGGER = "pipeline.backends.tensorrt.engine_cache"
ENGINE = 1000  # bytes of each fake engine
ENTRY = ENGINE + 64  # and its SHA-256 file (64 hex digits)


def store(cache: EngineCache, key: str, size: int = ENGINE) -> str:
    """Store an engine of ``size`` bytes under ``key``; the cache's status ("built", "hit", ...)."""
    return cache.get_or_build(key, lambda: key.encode()[:1] * size).status


def age(cache: EngineCache, key: str, seconds_ago: float) -> None:
    """Date an entry's last use back (or forward, for a negative age), as if it were stored or hit then."""
    when = time.time() - seconds_ago
    os.utime(cache.entry_path(key), (when, when))


def external_model(directory: Path) -> onnx.ModelProto:
    """A one-MatMul model saved to ``directory/m.onnx`` with its weight in ``directory/m.data``, loaded back without
    its external data (the digest reads it from the file)."""
    weight = numpy_helper.from_array(np.full((4, 4), 2.0, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, directory / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    return onnx.load_model(directory / "m.onnx", load_external_data=False)
