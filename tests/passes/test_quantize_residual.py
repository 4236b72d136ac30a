"""Residual Adds and ONNX Runtime's fusions (passes/quantize/residual.py, insert.py) on ResNet-style ONNX graphs:
the skip input of a residual Add is quantized and the convolution side is not (TensorRT's and ModelOpt's rule), the
output quantization before a Relu changes no value, and ONNX Runtime's CPU provider fuses the result into
QLinearConv."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from passes.quantize.formats import FORMATS
from passes.quantize.insert import quantize_graph
from passes.quantize.placement import plan_targets
from passes.quantize.residual import plan_residuals


def resnet_blocks() -> onnx.ModelProto:
    """stem conv -> relu -> [identity block] -> [downsampling block with a 1x1 skip conv] -> y.

    identity:   a -> conv1 -> relu -> conv2 -> Add(conv2, a) -> relu
    downsample: b -> conv3 -> relu -> conv4 -> Add(conv4, skip(b)) -> relu
    """
    rng = np.random.default_rng(0)

    def weight(name: str, k: int, c: int, size: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.normal(size=(k, c, size, size)) * 0.3).astype(np.float32), name)

    conv = helper.make_node
    nodes = [
        conv("Conv", ["x", "w0"], ["s"], name="stem", pads=[1, 1, 1, 1]),
        conv("Relu", ["s"], ["a"], name="stem_relu"),
        conv("Conv", ["a", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        conv("Relu", ["c1"], ["r1"], name="relu1"),
        conv("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        conv("Add", ["c2", "a"], ["sum1"], name="add1"),
        conv("Relu", ["sum1"], ["b"], name="relu2"),
        conv("Conv", ["b", "w3"], ["c3"], name="conv3", pads=[1, 1, 1, 1], strides=[2, 2]),
        conv("Relu", ["c3"], ["r3"], name="relu3"),
        conv("Conv", ["r3", "w4"], ["c4"], name="conv4", pads=[1, 1, 1, 1]),
        conv("Conv", ["b", "w5"], ["c5"], name="skip", strides=[2, 2]),
        conv("Add", ["c4", "c5"], ["sum2"], name="add2"),
        conv("Relu", ["sum2"], ["y"], name="relu4"),
    ]
    weights = [weight("w0", 8, 3, 3), weight("w1", 8, 8, 3), weight("w2", 8, 8, 3)]
    weights += [weight("w3", 16, 8, 3), weight("w4", 16, 16, 3), weight("w5", 16, 8, 1)]
    graph = helper.make_graph(
        nodes,
        "blocks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 8, 8])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def quantized(model: onnx.ModelProto, fmt: str = "int8") -> onnx.ModelProto:
    graph = gs.import_onnx(model)
    targets, _ = plan_targets(graph)
    residuals = plan_residuals(graph, targets)
    amax = dict.fromkeys([t.node for t in [*targets, *residuals]], 4.0)
    quantize_graph(graph, FORMATS[fmt], [*targets, *residuals], amax)
    out = gs.export_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    return out


def producer_ops(model: onnx.ModelProto, node: str) -> list[str]:
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    found = next(n for n in model.graph.node if n.name == node)
    return [producers.get(i, "input") for i in found.input]


def test_the_skip_input_of_each_residual_add_is_quantized_and_the_convolution_side_is_not() -> None:
    graph = gs.import_onnx(resnet_blocks())
    targets, _ = plan_targets(graph)
    residuals = plan_residuals(graph, targets)
    # add1: conv2 is the convolution side, the block input a the skip; add2: conv4 is on the longer path from the
    # block input b (conv3 -> relu -> conv4), the 1x1 skip conv on the shorter one
    assert [(r.node, r.activation) for r in residuals] == [("add1", 1), ("add2", 1)]
    out = quantized(resnet_blocks())
    assert producer_ops(out, "add1") == ["Conv", "DequantizeLinear"]
    assert producer_ops(out, "add2") == ["Conv", "DequantizeLinear"]


def test_an_add_whose_sides_both_come_from_one_convolution_is_not_residual() -> None:
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Add", ["c", "r"], ["y"], name="add"),  # ConvNeXt-like: Conv -> x -> Add <- Conv
    ]
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [w],
    )
    imported = gs.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    targets, _ = plan_targets(imported)
    assert plan_residuals(imported, targets) == []


def test_quantizing_the_convolution_output_before_a_relu_changes_no_value() -> None:
    out = quantized(resnet_blocks())
    # conv1 and conv3 feed a Relu whose readers are all quantized: their outputs are quantized with that scale
    assert producer_ops(out, "relu1") == ["DequantizeLinear"]
    assert producer_ops(out, "relu3") == ["DequantizeLinear"]
    assert producer_ops(out, "relu2") == ["Add"]  # after a residual Add: left as it is
    # the same graph without that step: identical outputs, bit for bit
    without = onnx.ModelProto()
    without.CopyFrom(out)
    rewired = {n.output[0]: n.input[0] for n in out.graph.node if n.name.endswith("/relu_input/DequantizeLinear")}
    rewired = {k: next(n.input[0] for n in out.graph.node if n.output[0] == v) for k, v in rewired.items()}
    for node in without.graph.node:
        for i, name in enumerate(node.input):
            if name in rewired:
                node.input[i] = rewired[name]
    x = np.random.default_rng(3).normal(size=(2, 3, 16, 16)).astype(np.float32) * 2
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graphs as written
    got = ort.InferenceSession(out.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    want = ort.InferenceSession(without.SerializeToString(), options, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got[0], want.run(None, {"x": x})[0])


def test_onnx_runtime_fuses_every_convolution_not_followed_by_a_residual_add_into_qlinearconv(tmp_path) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(quantized(resnet_blocks()).SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    # stem, conv1, conv3 (output quantized before their Relu: the stem's Relu output is read by conv1 and, as the
    # residual, by add1, both quantized with the tensor's one scale) and the skip conv (its output is the quantized
    # residual of add2); conv2 and conv4 stay float convolutions reading dequantized weights: they feed their Add
    # unquantized so that TensorRT can fuse the Add into them
    assert ops.count("QLinearConv") == 4
    assert ops.count("Conv") == 2


def test_fp8_graphs_get_the_residual_pairs_but_no_output_quantization() -> None:
    out = quantized(resnet_blocks(), "fp8")
    assert producer_ops(out, "add1") == ["Conv", "DequantizeLinear"]
    assert producer_ops(out, "relu1") == ["Conv"]
