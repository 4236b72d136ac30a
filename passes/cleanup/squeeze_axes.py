"""Squeeze without ``axes`` given explicit axes (TensorRT's parser accepts the axes-less form only from 11.5).

The torch exporter writes it for scalar shape arithmetic under dynamic shapes (``sym_size``). Axes are known
when every dimension of the input is static, or symbolic but not of size 1 per the shape recorded; a squeeze whose
input has unknown rank or symbolic dims is left alone (the parser check reports it).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import PassResult


class ExplicitSqueezeAxes:
    """Squeeze without ``axes`` gets the axes of its input's size-1 dims as an initializer, where the shape is known."""

    name = "explicit_squeeze_axes"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        modified = False
        for node in graph.nodes:
            if node.op != "Squeeze" or node.domain not in ("", None, "ai.onnx"):
                continue
            if len(node.inputs) > 1 and node.inputs[1].name or "axes" in node.attrs:
                continue
            shape = node.inputs[0].shape
            if shape is None or not all(isinstance(d, int) for d in shape):
                continue
            axes = np.array([i for i, d in enumerate(shape) if d == 1], np.int64)
            constant = gs.Constant(f"{node.name}/axes", axes)
            if len(node.inputs) > 1:  # an empty optional input slot
                node.inputs[1] = constant
            else:
                node.inputs.append(constant)
            modified = True
        return PassResult(graph, modified)
