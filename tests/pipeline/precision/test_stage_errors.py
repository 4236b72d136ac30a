"""The precision stage's failures are ConversionErrors naming the stage, never ONNX Runtime's raw exception: a graph
ONNX Runtime cannot load (a node without a kernel for its types, here written by a user's pass) is said with the node
and where to look, and debug_passes names the pass that made it."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch

import passes
import pipeline
from converters.settings import Settings


class Int16Where:
    """Adds zero to the output through an int16 ``Where``, which ONNX Runtime's CPU provider has no kernel for."""

    name = "int16_where"

    def __call__(self, graph: gs.Graph, settings: Settings) -> passes.PassResult:
        if any(node.name == "int16_where" for node in graph.nodes):
            return passes.PassResult(graph, modified=False)
        out = graph.outputs[0]
        inner = gs.Variable("pre_out", dtype=out.dtype, shape=out.shape)
        out.inputs[0].outputs = [inner]
        small, chosen = (gs.Variable(n, dtype=np.int16, shape=out.shape) for n in ("small", "chosen"))
        back, zero = (gs.Variable(n, dtype=np.float32, shape=out.shape) for n in ("back", "zero"))
        graph.nodes += [
            gs.Node("Cast", "to_int16", {"to": onnx.TensorProto.INT16}, [inner], [small]),
            gs.Node("Where", "int16_where", {}, [gs.Constant("yes", np.array(True)), small, small], [chosen]),
            gs.Node("Cast", "to_float", {"to": onnx.TensorProto.FLOAT}, [chosen], [back]),
            gs.Node("Mul", "times_zero", {}, [back, gs.Constant("nought", np.array(0.0, np.float32))], [zero]),
            gs.Node("Add", "plus_zero", {}, [inner, zero], [out]),
        ]
        graph.toposort()
        return passes.PassResult(graph, modified=True)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()


def test_a_graph_onnx_runtime_cannot_load_is_a_precision_stage_error_naming_the_node() -> None:
    with pytest.raises(pipeline.ConversionError) as caught:
        pipeline.convert(
            _model(), torch.randn(2, 4), precision="fp16", extra_passes=[("after", "fold_constants", Int16Where())]
        )
    text = str(caught.value)
    assert "precision stage" in text and "int16_where" in text and "debug_passes=True" in text


def test_debug_passes_names_the_pass_after_which_the_graph_stops_loading() -> None:
    with pytest.raises(pipeline.ConversionError, match="after pass 'int16_where'"):
        pipeline.convert(
            _model(),
            torch.randn(2, 4),
            precision="fp16",
            debug_passes=True,
            extra_passes=[("after", "fold_constants", Int16Where())],
        )
