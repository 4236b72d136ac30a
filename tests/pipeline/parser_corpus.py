"""Single-op ONNX graphs on which the static parser table and a real parser are compared (tests/pipeline/
test_real_parser.py): one graph per rule of ``pipeline/compatibility/rules.py``, on both sides of it, and ops the table
marks unsupported. Each graph's one node of interest is named ``n``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx_models import onnx_model

F, F16, I64, I32, U8, B = (
    TensorProto.FLOAT,
    TensorProto.FLOAT16,
    TensorProto.INT64,
    TensorProto.INT32,
    TensorProto.UINT8,
    TensorProto.BOOL,
)
X4 = [("x", F, [1, 2, 4, 4])]


def unary(op: str, elem: int = F, shape: list[int] | None = None, **attrs: object) -> onnx.ModelProto:
    shape = shape or [2, 3]
    return onnx_model(
        [helper.make_node(op, ["x"], ["y"], name="n", **attrs)], [("x", elem, shape)], [("y", elem, None)]
    )


def resize(**attrs: object) -> onnx.ModelProto:
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], name="n", **attrs)
    return onnx_model([node], X4, [("y", F, None)], {"s": np.array([1, 1, 2, 2], np.float32)})


def topk(k: int = 2, **attrs: object) -> onnx.ModelProto:
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="n", **attrs)
    return onnx_model([node], [("x", F, [2, 5000])], [("v", F, None), ("i", I64, None)], {"k": np.array([k], np.int64)})


def pool(op: str, shape: list[int], **attrs: object) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], name="n", **attrs)
    return onnx_model([node], [("x", F, shape)], [("y", F, None)])


def maxpool_indices() -> onnx.ModelProto:
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="n", kernel_shape=[2, 2])
    return onnx_model([node], X4, [("y", F, None), ("i", I64, None)])


def layernorm_two_outputs() -> onnx.ModelProto:
    node = helper.make_node("LayerNormalization", ["x", "g"], ["y", "m"], name="n", axis=-1)
    return onnx_model([node], [("x", F, [2, 4])], [("y", F, None), ("m", F, None)], {"g": np.ones(4, np.float32)})


def dropout(training: bool) -> onnx.ModelProto:
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="n")
    inits = {"r": np.array(0.5, np.float32), "t": np.array(training)}
    return onnx_model([node], [("x", F, [2, 3])], [("y", F, None)], inits)


def qdq(zero_point: int) -> onnx.ModelProto:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="n"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq"),
    ]
    inits = {"s": np.array(0.1, np.float32), "z": np.array(zero_point, np.int8)}
    return onnx_model(nodes, [("x", F, [2, 3])], [("y", F, None)], inits)


def scatter_nd(reduction: str) -> onnx.ModelProto:
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="n", reduction=reduction)
    inits = {"i": np.array([[0]], np.int64), "u": np.ones((1, 3), np.float32)}
    return onnx_model([node], [("x", F, [2, 3])], [("y", F, None)], inits)


def squeeze(with_axes: bool) -> onnx.ModelProto:
    inputs = ["x", "a"] if with_axes else ["x"]
    node = helper.make_node("Squeeze", inputs, ["y"], name="n")
    inits = {"a": np.array([0], np.int64)} if with_axes else {}
    return onnx_model([node], [("x", F, [1, 3])], [("y", F, None)], inits)


def reduce_runtime_axes() -> onnx.ModelProto:
    node = helper.make_node("ReduceSum", ["x", "a"], ["y"], name="n")
    return onnx_model([node], [("x", F, [2, 3]), ("a", I64, [1])], [("y", F, None)])


def grid_sample(rank: int) -> onnx.ModelProto:
    shape, grid = ([1, 1, 4, 4], [1, 2, 2, 2]) if rank == 4 else ([1, 1, 4, 4, 4], [1, 2, 2, 2, 3])
    node = helper.make_node("GridSample", ["x", "g"], ["y"], name="n")
    return onnx_model([node], [("x", F, shape), ("g", F, grid)], [("y", F, None)], opset=20)


def uint8_intermediate() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Cast", ["x"], ["u"], name="n", to=U8),
        helper.make_node("Cast", ["u"], ["y"], name="back", to=F),
    ]
    return onnx_model(nodes, [("x", F, [2, 3])], [("y", F, None)])


def binary(op: str, elem: int = F) -> onnx.ModelProto:
    node = helper.make_node(op, ["a", "b"], ["y"], name="n")
    out = B if op in ("Equal", "Less", "Greater") else elem
    return onnx_model([node], [("a", elem, [2, 3]), ("b", elem, [2, 3])], [("y", out, None)])


def cumsum(constant_axis: bool) -> onnx.ModelProto:
    node = helper.make_node("CumSum", ["x", "a"], ["y"], name="n")
    if constant_axis:
        return onnx_model([node], [("x", F, [2, 3])], [("y", F, None)], {"a": np.array(1, np.int64)})
    return onnx_model([node], [("x", F, [2, 3]), ("a", I64, [])], [("y", F, None)])


def nonzero() -> onnx.ModelProto:
    return onnx_model([helper.make_node("NonZero", ["x"], ["y"], name="n")], [("x", F, [2, 3])], [("y", I64, None)])


def einsum() -> onnx.ModelProto:
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="n", equation="ij,jk->ik")
    return onnx_model([node], [("a", F, [2, 3]), ("b", F, [3, 4])], [("y", F, None)])


def bool_input(op: str) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], name="n")
    return onnx_model([node], [("x", B, [2, 3])], [("y", B, None)])


#: case id -> graph. The ids name the op and the side of the rule ("ok" where the table accepts).
CASES: dict[str, Callable[[], onnx.ModelProto]] = {
    "Relu ok": lambda: unary("Relu"),
    "Resize linear ok": lambda: resize(mode="linear"),
    "Resize nearest ok": lambda: resize(mode="nearest"),
    "Resize cubic": lambda: resize(mode="cubic"),
    "Resize antialias": lambda: resize(mode="linear", antialias=1),
    "Resize tf_crop_and_resize": lambda: resize(mode="linear", coordinate_transformation_mode="tf_crop_and_resize"),
    "Resize half_pixel_symmetric": lambda: resize(mode="linear", coordinate_transformation_mode="half_pixel_symmetric"),
    "TopK sorted ok": lambda: topk(),
    "TopK sorted=0": lambda: topk(sorted=0),
    "TopK K=4000": lambda: topk(4000),
    "MaxPool 2D ok": lambda: pool("MaxPool", [1, 2, 4, 4], kernel_shape=[2, 2]),
    "MaxPool 1D": lambda: pool("MaxPool", [1, 2, 8], kernel_shape=[2]),
    "MaxPool dilations": lambda: pool("MaxPool", [1, 2, 8, 8], kernel_shape=[2, 2], dilations=[2, 2]),
    "MaxPool Indices": maxpool_indices,
    "AveragePool 1D": lambda: pool("AveragePool", [1, 2, 8], kernel_shape=[2]),
    "AveragePool window 317x317": lambda: pool(
        "AveragePool", [1, 2, 2, 2], kernel_shape=[317, 317], ceil_mode=1, strides=[317, 317]
    ),
    "LpPool 1D": lambda: pool("LpPool", [1, 2, 8], kernel_shape=[2]),
    "LpPool 2D ok": lambda: pool("LpPool", [1, 2, 8, 8], kernel_shape=[2, 2]),
    "LayerNormalization Mean output": layernorm_two_outputs,
    "Dropout eval ok": lambda: dropout(False),
    "Dropout training": lambda: dropout(True),
    "QDQ zero point 0 ok": lambda: qdq(0),
    "QDQ zero point 3": lambda: qdq(3),
    "ScatterND none ok": lambda: scatter_nd("none"),
    "ScatterND add": lambda: scatter_nd("add"),
    "Squeeze axes ok": lambda: squeeze(True),
    "Squeeze no axes": lambda: squeeze(False),
    "ReduceSum runtime axes": reduce_runtime_axes,
    "GridSample 4D ok": lambda: grid_sample(4),
    "GridSample 5D": lambda: grid_sample(5),
    "Cast to UINT8 intermediate": uint8_intermediate,
    "CumSum constant axis ok": lambda: cumsum(True),
    "CumSum runtime axis": lambda: cumsum(False),
    "Abs INT32 ok": lambda: unary("Abs", I32),
    "Sqrt INT64": lambda: unary("Sqrt", I64),
    "Not BOOL ok": lambda: bool_input("Not"),
    "Add INT32 ok": lambda: binary("Add", I32),
    "NonZero ok": nonzero,
    "Einsum ok": einsum,
    "Det": lambda: unary("Det", shape=[3, 3]),
    "DFT": lambda: unary("DFT", shape=[1, 8, 1]),
    "Unique": lambda: unary("Unique", shape=[6]),
    "BitwiseNot": lambda: unary("BitwiseNot", I32),
    "Mish ok": lambda: unary("Mish"),
    "HardSwish ok": lambda: unary("HardSwish"),
    "Gelu ok": lambda: unary("Gelu"),
    "Celu ok": lambda: unary("Celu"),
    "Hardmax ok": lambda: unary("Hardmax"),
    "LpNormalization ok": lambda: unary("LpNormalization"),
    "MeanVarianceNormalization ok": lambda: unary("MeanVarianceNormalization", shape=[1, 2, 3, 3]),
    "Shrink ok": lambda: unary("Shrink"),
    "IsInf ok": lambda: onnx_model(
        [helper.make_node("IsInf", ["x"], ["y"], name="n")], [("x", F, [2, 3])], [("y", B, None)]
    ),
}
