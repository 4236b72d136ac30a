"""The INT8 graph ONNX Runtime's CPU backend runs (pipeline/runtime/ort/int8.py): its rewrites change no value (bit
for bit on ONNX Runtime's reference kernels, saturation included), move Relu, MaxPool and convolutions into integer
kernels, and never let ONNX Runtime requantize a float weight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import pipeline
from passes import to_graph, to_model
from passes.quantize.formats import FORMATS
from passes.quantize.insert import quantize_graph
from passes.quantize.placement import plan_targets
from passes.quantize.residual import plan_residuals
from pipeline.runtime.ort.int8 import (
    conv_output_ranges,
    disabled_optimizers,
    integer_relu_and_pool,
    ort_int8_graph,
    quantize_weighted_outputs,
    record_conv_output_ranges,
    requantize_conv_outputs,
    share_quantize,
    switch_to_uint8,
)
from pipeline.runtime.ort.integer_conv import integer_float_convs
from pipeline.runtime.ort.saturation import u8s8_saturates, unsigned_weights

PLAIN = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def stem_model() -> onnx.ModelProto:
    """x (2x8x12x12) -> Conv -> Relu -> MaxPool -> {Conv -> Relu -> Conv, Conv} -> Add -> Relu -> two Convs (y, z):
    a ResNet stem, a block of 32 channels and two heads, float biases as batch-norm folding leaves."""
    rng = np.random.default_rng(0)

    def conv(name: str, cin: int, cout: int, source: str, out: str, k: int = 3) -> onnx.NodeProto:
        weights.append(numpy_helper.from_array(rng.normal(0, 0.3, (cout, cin, k, k)).astype(np.float32), f"{name}.w"))
        weights.append(numpy_helper.from_array(rng.normal(0, 0.5, cout).astype(np.float32), f"{name}.b"))
        return helper.make_node("Conv", [source, f"{name}.w", f"{name}.b"], [out], name, pads=[k // 2] * 4)

    weights: list[onnx.TensorProto] = []
    nodes = [
        conv("stem", 8, 32, "x", "c0"),
        helper.make_node("Relu", ["c0"], ["r0"], "stem_relu"),
        helper.make_node("MaxPool", ["r0"], ["p0"], "pool", kernel_shape=[2, 2], strides=[2, 2]),
        conv("conv1", 32, 32, "p0", "c1"),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        conv("conv2", 32, 32, "r1", "c2"),
        conv("skip", 32, 32, "p0", "c3", k=1),
        helper.make_node("Add", ["c2", "c3"], ["a"], "add"),
        helper.make_node("Relu", ["a"], ["r2"], "relu2"),
        conv("head1", 32, 4, "r2", "y"),
        conv("head2", 32, 4, "r2", "z", k=1),
    ]
    graph = helper.make_graph(
        nodes,
        "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 12, 12])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4, 6, 6]) for n in ("y", "z")],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def quantized_stem() -> onnx.ModelProto:
    """:func:`stem_model` as TensorRT gets it: INT8 Q/DQ at every convolution's inputs and at the residual Add's skip
    input, small ranges so that the inputs below saturate."""
    graph = gs.import_onnx(stem_model())
    targets, _ = plan_targets(graph)
    quantize_graph(
        graph,
        FORMATS["int8"],
        [*targets, *plan_residuals(graph, targets)],
        {"stem": 2.0, "conv1": 1.5, "conv2": 1.0, "skip": 1.5, "add": 1.5, "head1": 2.0, "head2": 2.0},
    )
    return onnx.shape_inference.infer_shapes(gs.export_onnx(graph))  # the pipeline's final graphs carry shapes


def run(model: onnx.ModelProto, x: np.ndarray, level: ort.GraphOptimizationLevel, path: Path | None = None) -> Any:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    if path is not None:
        options.optimized_model_filepath = str(path)
    session = ort.InferenceSession(
        model.SerializeToString(), options, ["CPUExecutionProvider"], disabled_optimizers=disabled_optimizers(model)
    )
    return np.concatenate([o.ravel() for o in session.run(None, {"x": x})])


def inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.normal(0, scale, (2, 8, 12, 12)).astype(np.float32) for scale in (0.5, 2.0, 8.0)]


def test_value_preserving_rewrites_are_exact_bit_for_bit() -> None:
    model = quantized_stem()
    graph, metadata = to_graph(model)
    assert quantize_weighted_outputs(graph) == 2  # the stem (Conv -> Relu -> MaxPool -> Q) and Add -> Relu -> Q
    assert switch_to_uint8(graph) > 0
    assert integer_relu_and_pool(graph) == 4  # the stem's Relu and MaxPool, conv1's Relu, the block's Relu
    assert share_quantize(graph) == 0  # the block output's two pairs read one integer Relu: nothing left to share
    graph.cleanup().toposort()
    rewritten = to_model(graph, model, metadata)
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [n.op_type for n in rewritten.graph.node]
    assert "Relu" not in ops and ops.count("Max") == 3 and ops.count("MaxPool") == 1
    types = {
        v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(rewritten).graph.value_info
    }
    for node in rewritten.graph.node:
        if node.op_type in ("Max", "MaxPool"):
            assert types[node.input[0]] == TensorProto.UINT8, node.name  # integer kernels, no float round trip
    for x in inputs():  # the largest scale saturates every quantized tensor
        np.testing.assert_array_equal(run(rewritten, x, PLAIN), run(model, x, PLAIN))


def test_onnx_runtime_runs_every_convolution_in_an_integer_kernel(tmp_path: Path) -> None:
    model = quantized_stem()
    session_graph = ort_int8_graph(model)
    onnx.checker.check_model(session_graph, full_check=True)
    run(session_graph, inputs()[1], ALL, tmp_path / "optimized.onnx")
    ops = [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]
    # stem, conv1 and the skip convolution have quantized outputs: QLinearConv; conv2 (before the residual Add) and
    # the two heads (graph outputs) have float outputs: MatMulIntegerToFloat over their patches
    assert ops.count("QLinearConv") == 3, ops
    assert ops.count("MatMulIntegerToFloat") == 3, ops
    assert not {"Conv", "FusedConv", "Relu", "MaxPool"} & set(ops), ops  # no float convolution, Relu or pooling
    assert "WeightBiasQuantization" in disabled_optimizers(session_graph)


def test_the_session_graph_computes_what_onnx_runtime_computes_for_the_tensorrt_graph() -> None:
    model = quantized_stem()
    session_graph = ort_int8_graph(model)
    for x in inputs():
        # the reference: TensorRT's graph on ONNX Runtime's float kernels (Q/DQ computed as ONNX defines them); the
        # int32 biases of the integer convolutions are ONNX Runtime's one change (at most half an accumulator unit
        # each), within one quantization step of the output
        want = run(model, x, PLAIN)
        got = run(session_graph, x, ALL)
        step = 1.0 / 127
        assert np.abs(got - want).max() <= 4 * step * np.abs(want).max() + 1e-6


def test_float_output_convolution_is_the_integer_sum_of_the_quantized_values() -> None:
    """conv2 and the heads run as im2col + MatMulIntegerToFloat: against the Q/DQ graph's value in float64, it is as
    close as float32 allows (closer than ONNX Runtime's float Conv over dequantized values)."""
    model = quantized_stem()
    graph, metadata = to_graph(model)
    switch_to_uint8(graph)
    assert integer_float_convs(graph) == 3
    graph.cleanup().toposort()
    rewritten = to_model(graph, model, metadata)
    rewritten.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    if u8s8_saturates():  # as ort_int8_graph does on this CPU (rewrite 8)
        rewritten, switched = unsigned_weights(rewritten)
        assert switched == 3 + 3  # the three MatMulIntegerToFloat weights, the three QLinearConv weights
    x = inputs()[0]
    exact = _float64_heads(model, x)
    got = run(rewritten, x, PLAIN)
    floating = run(model, x, PLAIN)
    scale = np.abs(exact).max()
    assert np.abs(got - exact).max() <= 1e-6 * scale
    assert np.abs(got - exact).max() <= np.abs(floating - exact).max() + 1e-7 * scale


def _float64_heads(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The heads' outputs computed from the graph's own quantized block output ``r2`` in float64 (the exact value of
    ``DQ -> Conv`` on those 8-bit values)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info("r2/quantized", TensorProto.INT8, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = PLAIN
    session = ort.InferenceSession(probe.SerializeToString(), options, ["CPUExecutionProvider"])
    quantized = session.run(["r2/quantized"], {"x": x})[0].astype(np.float64)
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    scale = float(initializers["r2/quant_scale"])
    outputs = []
    for head, k in (("head1", 3), ("head2", 1)):
        weight = initializers[f"{head}.w/quantized_int8"].astype(np.float64)
        weight *= initializers[f"{head}.w/weight_scale"].astype(np.float64).reshape(-1, 1, 1, 1)
        bias = initializers[f"{head}.b"].astype(np.float64)
        outputs.append(_conv64(quantized * scale, weight, bias, k // 2).ravel())
    return np.concatenate(outputs)


def _conv64(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = w.shape[2]
    h, wd = x.shape[2], x.shape[3]
    out = np.zeros((x.shape[0], w.shape[0], h, wd))
    for i in range(k):
        for j in range(k):
            out += np.einsum("nchw,oc->nohw", padded[:, :, i : i + h, j : j + wd], w[:, :, i, j])
    return out + b.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("fallback", ["fp16", "fp32"])
def test_int8_with_the_fp16_fallback_on_the_cpu_says_it_is_slow_and_how_to_be_fast(fallback: str) -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 4, 1))
    module = pipeline.convert(
        model.eval(),
        torch.randn(2, 8, 8, 8),
        precision="int8",
        quantize_fallback=fallback,
        backend="onnxruntime",
        validate=False,
    )
    report = module.report.quantization
    assert report is not None
    slow = [w for w in report.warnings if "no fp16 kernels" in w]
    if fallback == "fp16":
        assert len(slow) == 1 and "quantize_fallback='fp32'" in slow[0]
        assert "no fp16 kernels" in module.report.summary()
    else:
        assert not slow


def test_recorded_convolution_output_ranges_round_trip_through_the_model_metadata() -> None:
    model = record_conv_output_ranges(quantized_stem(), {"c2": 1.25, "c1": 0.5})
    assert conv_output_ranges(model) == {"c1": 0.5, "c2": 1.25}
    assert conv_output_ranges(quantized_stem()) == {}
    assert conv_output_ranges(record_conv_output_ranges(model, {})) == {}  # an empty record removes the entry


def test_requantized_convolution_output_makes_the_residual_block_integer(tmp_path: Path) -> None:
    """Rewrite 0: conv2's float output (read by the residual Add only) gets its own INT8 pair with the recorded
    range, so ONNX Runtime runs conv2 as QLinearConv and the Add as QLinearAdd; conv1 (read by a Relu, rewrite 1's
    exact case) and the heads (graph outputs) are left alone; ``conv_outputs="exact"`` leaves conv2 float."""
    model = record_conv_output_ranges(quantized_stem(), {"c2": 14.0, "c1": 3.0, "y": 3.0})  # c2 peaks at 13.6
    graph, _ = to_graph(model)
    quantize_weighted_outputs(graph)
    assert requantize_conv_outputs(graph, conv_output_ranges(model)) == ["c2"]
    session_graph = ort_int8_graph(model)
    onnx.checker.check_model(session_graph, full_check=True)
    x = inputs()[0]
    got = run(session_graph, x, ALL, tmp_path / "optimized.onnx")
    ops = [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]
    assert ops.count("QLinearConv") == 4 and ops.count("QLinearAdd") == 1, ops  # stem, conv1, skip, conv2
    assert ops.count("MatMulIntegerToFloat") == 2 and "Conv" not in ops, ops  # the two heads
    exact = run(ort_int8_graph(model, "exact"), x, ALL)
    want = run(model, x, PLAIN)
    step = 1.0 / 127
    assert np.abs(exact - want).max() <= 4 * step * np.abs(want).max() + 1e-6
    # one more rounding of conv2's output (half a step of 14 / 127) before the Add: visible, and bounded
    assert np.abs(got - exact).max() > 1e-4
    assert np.abs(got - want).max() <= 3 * step * np.abs(want).max() + 1e-6  # measured: 1.8 steps
    with pytest.raises(ValueError, match="conv_outputs"):
        ort_int8_graph(model, "fast")


def saturating_conv(weight_type: int) -> onnx.ModelProto:
    """``DQ(uint8 x) -> Conv(DQ(weight)) -> Q -> DQ``, 64 channels, 1x1: ONNX Runtime fuses it into QLinearConv; the
    weight is +-127 in int8 (zero point 0) or the same values in uint8 (zero point 128)."""
    signs = np.where(np.arange(64 * 64).reshape(64, 64, 1, 1) % 3 == 0, -1, 1)
    q = (127 * signs).astype(np.int16)
    stored, zero = (
        (q.astype(np.int8), np.int8(0))
        if weight_type == TensorProto.INT8
        else ((q + 128).astype(np.uint8), np.uint8(128))
    )
    consts = [
        numpy_helper.from_array(stored, "w"),
        numpy_helper.from_array(np.array(1 / 127, np.float32), "ws"),
        numpy_helper.from_array(np.array(zero), "wz"),
        numpy_helper.from_array(np.array(1 / 255, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, np.uint8), "xz"),
        numpy_helper.from_array(np.array(0.25, np.float32), "ys"),
        numpy_helper.from_array(np.array(128, np.uint8), "yz"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"], "dq_x"),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], "dq_w"),
        helper.make_node("Conv", ["xf", "wf"], ["c"], "conv"),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], "q_y"),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"], "dq_y"),
    ]
    graph = helper.make_graph(
        nodes,
        "saturating",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 64, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 4, 4])],
        consts,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_uint8_weights_escape_the_saturating_kernel_and_the_probe_says_when_it_saturates() -> None:
    """Rewrite 8: activations at 255 against weights at +-127, fused into QLinearConv: the uint8-weight form is exact;
    the int8 form departs exactly when :func:`u8s8_saturates` says this CPU's kernel saturates (no VNNI)."""
    x = np.full((1, 64, 4, 4), 255, np.uint8)
    want = run_uint8(saturating_conv(TensorProto.INT8), x, PLAIN)
    assert np.abs(want).max() > 10  # sums of 64 products, far from 0
    np.testing.assert_array_equal(run_uint8(saturating_conv(TensorProto.UINT8), x, ALL), want)
    fused_int8 = run_uint8(saturating_conv(TensorProto.INT8), x, ALL)
    assert bool(np.abs(fused_int8 - want).max() > 0.5) == u8s8_saturates()


def run_uint8(model: onnx.ModelProto, x: np.ndarray, level: ort.GraphOptimizationLevel) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def test_uint8_weights_compute_the_same_values_bit_for_bit() -> None:
    """Rewrite 8: every int8 weight as uint8 with zero point 128 gives, on ONNX Runtime's reference kernels, the
    Q/DQ graph's values bit for bit (whether the fused int8 kernel saturates: the saturating-kernel test)."""
    model = quantized_stem()
    unsigned, switched = unsigned_weights(model)
    assert switched == 6  # the six convolutions' weights
    kinds = {t.name: t.data_type for t in unsigned.graph.initializer}
    weights = [n.input[0] for n in unsigned.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in kinds]
    assert sum(kinds[w] == TensorProto.UINT8 for w in weights) == 6
    assert not any(kinds[w] == TensorProto.INT8 for w in weights)
    for x in inputs():  # the largest scale saturates every quantized activation
        np.testing.assert_array_equal(run(unsigned, x, PLAIN), run(model, x, PLAIN))
