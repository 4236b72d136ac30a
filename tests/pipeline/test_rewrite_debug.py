"""Debug mode and the real builder: the first pass after which TensorRT-RTX no longer builds the graph is named."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
import torch
from rtx_build import SKIP_REASON
from torch import nn

import pipeline
from converters.settings import Settings
from passes.base import PassResult
from pipeline.precision.buildable import rtx_available


class ReluThroughDet:
    """A pass that keeps every value (ONNX Runtime sees no change) but writes Relu(x) as Max(x, 0 * Det(I)):
    Det is an op TensorRT's parser rejects."""

    name = "relu_through_det"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        changed = False
        for node in [n for n in graph.nodes if n.op == "Relu"]:
            det = gs.Variable(f"{node.name}_det", dtype=np.float32)
            zero = gs.Variable(f"{node.name}_zero", dtype=np.float32)
            identity = gs.Constant(f"{node.name}_eye", np.eye(2, dtype=np.float32))
            graph.nodes.append(gs.Node("Det", f"{node.name}/det", inputs=[identity], outputs=[det]))
            graph.nodes.append(
                gs.Node(
                    "Mul",
                    f"{node.name}/zero",
                    inputs=[det, gs.Constant(f"{node.name}_0", np.zeros((), np.float32))],
                    outputs=[zero],
                )
            )
            node.op, node.inputs = "Max", [node.inputs[0], zero]
            changed = True
        return PassResult(graph, changed)


def test_debug_mode_names_the_pass_after_which_the_real_builder_fails() -> None:
    if not rtx_available():
        pytest.skip(SKIP_REASON)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    extra = [("after", "remove_identities", ReluThroughDet())]
    with pytest.raises(pipeline.ConversionError, match=r"after pass 'relu_through_det'.*no longer builds.*Det"):
        pipeline.convert(model, torch.randn(3, 4), backend="onnxruntime", debug_passes=True, extra_passes=extra)
