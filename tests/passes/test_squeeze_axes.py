"""ExplicitSqueezeAxes: the axes-less Squeeze the exporter writes gets explicit axes when shapes are static."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from converters.settings import Settings
from passes.cleanup.squeeze_axes import ExplicitSqueezeAxes


def squeeze_graph(shape: tuple[int | str, ...]) -> gs.Graph:
    x = gs.Variable("x", dtype=np.float32, shape=shape)
    y = gs.Variable("y", dtype=np.float32, shape=tuple(d for d in shape if d != 1))
    graph = gs.Graph(nodes=[gs.Node("Squeeze", "sq", inputs=[x], outputs=[y])], inputs=[x], outputs=[y], opset=20)
    graph.ir_version = 10
    return graph


def test_static_shape_gets_axes_and_same_numbers() -> None:
    result = ExplicitSqueezeAxes()(squeeze_graph((1, 3, 1)), Settings())
    assert result.modified
    axes = result.graph.nodes[0].inputs[1]
    assert isinstance(axes, gs.Constant) and axes.values.tolist() == [0, 2]
    model = gs.export_onnx(result.graph)
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(0).standard_normal((1, 3, 1)).astype(np.float32)
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, x.reshape(3))


def test_symbolic_shape_is_left_alone() -> None:
    result = ExplicitSqueezeAxes()(squeeze_graph(("batch", 1)), Settings())
    assert not result.modified and len(result.graph.nodes[0].inputs) == 1
