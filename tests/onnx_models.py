"""Small hand-written ONNX models for pass and check tests (importable as ``onnx_models``: tests/ is on sys.path)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

Shape = Sequence[int | str] | None


def onnx_model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, Shape]],
    outputs: list[tuple[str, int, Shape]],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 20,
) -> onnx.ModelProto:
    """A model of ``nodes`` with (name, element type, shape) inputs and outputs, at IR 10 (what ONNX Runtime 1.31
    reads; onnx 1.23 would write a newer one)."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
