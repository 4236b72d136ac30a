"""The Q/DQ rewrite (passes/quantize) on small ONNX graphs: op placement, stored weights, and the numbers on ONNX
Runtime against a numpy reference that fake-quantizes weights and activations independently."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from quantize_support import conv_gemm_model

from converters.errors import ConversionError
from passes.quantize.formats import FORMATS
from passes.quantize.insert import quantize_graph
from passes.quantize.placement import plan_targets


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``model`` on ONNX Runtime's reference kernels (no fusion: the graph's own values, whatever this CPU's integer
    kernels do; the session graph the backend runs is :mod:`pipeline.runtime.ort.int8`'s)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def reference(x: np.ndarray, model: onnx.ModelProto, fmt_name: str, amax: dict[str, float]) -> list[np.ndarray]:
    """The float graph with weights fake-quantized per output channel and activations per tensor, in numpy."""
    fmt = FORMATS[fmt_name]
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}

    def per_channel(w: np.ndarray, axis: int) -> np.ndarray:
        others = tuple(i for i in range(w.ndim) if i != axis)
        shape = [1] * w.ndim
        shape[axis] = -1
        return fmt.fake_quantize(w, fmt.scale_for(np.abs(w).max(axis=others)).reshape(shape))

    fake = dict(weights, w=per_channel(weights["w"], 0), g=per_channel(weights["g"], 0), h=per_channel(weights["h"], 1))
    float_model = onnx.ModelProto()
    float_model.CopyFrom(model)
    for t in float_model.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(fake[t.name], t.name))
    # activations: x before the conv, f before the Gemm and the MatMul (shared)
    xq = fmt.fake_quantize(x, fmt.scale_for(amax["conv"]))
    conv_only = helper.make_model(
        helper.make_graph(
            float_model.graph.node[:3],
            "c",
            list(float_model.graph.input),
            [helper.make_tensor_value_info("f", TensorProto.FLOAT, None)],
            list(float_model.graph.initializer),
        ),
        opset_imports=model.opset_import,
    )
    f = run(conv_only, {"x": xq})[0]
    fq = fmt.fake_quantize(f, fmt.scale_for(amax["gemm"]))
    return [fq @ fake["g"].T, fq @ fake["h"]]


@pytest.mark.parametrize("fmt_name", ["int8", "fp8"])
def test_weighted_ops_read_dequantized_inputs_and_match_the_numpy_reference(fmt_name: str) -> None:
    model = conv_gemm_model()
    x = np.random.default_rng(1).normal(size=(2, 2, 4, 4)).astype(np.float32)
    amax = {"conv": 2.0, "gemm": 3.0, "matmul": 3.0}
    graph = gs.import_onnx(model)
    targets, skipped = plan_targets(graph)
    assert [(t.node, t.axis) for t in targets] == [("conv", 0), ("gemm", 0), ("matmul", 1)] and not skipped
    done = quantize_graph(graph, FORMATS[fmt_name], targets, amax)
    out = gs.export_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("QuantizeLinear") == 3  # x, and f once per quantized reader (ONNX Runtime fuses only those)
    assert ops.count("DequantizeLinear") == 3 + 3  # three activation pairs, three weights
    readers = {i: [n for n in out.graph.node if i in n.input] for n in out.graph.node for i in n.input}
    pairs = [n for n in out.graph.node if n.op_type == "QuantizeLinear"]
    assert all(len(readers[q.output[0]]) == 1 for q in pairs)  # each pair has one reader
    assert len({q.input[1] for q in pairs}) == 3  # and its own scale initializer (no merging by ORT's CSE)
    producers = {o: n for n in out.graph.node for o in n.output}
    for node in out.graph.node:
        if node.op_type in ("Conv", "Gemm", "MatMul"):
            assert [producers[i].op_type for i in node.input[:2]] == ["DequantizeLinear", "DequantizeLinear"]
    stored = {t.name: t.data_type for t in out.graph.initializer}
    assert stored["w/quantized_" + fmt_name] == FORMATS[fmt_name].onnx_type
    assert all(name not in stored for name in ("w", "g", "h"))  # float weights are gone
    assert [op.weight_channels for op in done] == [4, 5, 3]
    got = run(out, {"x": x})
    want = reference(x, model, fmt_name, amax)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt_name", ["int8", "fp8"])
def test_numpy_quantization_matches_onnx_runtime_kernels_with_ties_and_saturation(fmt_name: str) -> None:
    fmt = FORMATS[fmt_name]
    values = np.concatenate(
        [np.random.default_rng(2).normal(scale=200, size=1000), [0.5, 1.5, 2.5, -2.5, 1e6, -1e6, 464.0, 0.0]]
    ).astype(np.float32)
    scale = np.asarray(1.0, np.float32)
    zero = helper.make_tensor("zp", fmt.onnx_type, [], [0])
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"]),
        ],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [values.size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [values.size])],
        [numpy_helper.from_array(scale, "s"), zero],
    )
    got = run(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), {"x": values})[0]
    np.testing.assert_array_equal(got, fmt.fake_quantize(values, scale))
    assert np.abs(got).max() == (128.0 if fmt_name == "int8" else 448.0)  # saturated, never NaN


def test_fp8_weights_are_stored_as_e4m3() -> None:
    graph = gs.import_onnx(conv_gemm_model())
    targets, _ = plan_targets(graph)
    quantize_graph(graph, FORMATS["fp8"], targets, {"conv": 1.0, "gemm": 1.0, "matmul": 1.0})
    weight = next(t for t in gs.export_onnx(graph).graph.initializer if t.name == "w/quantized_fp8")
    values = numpy_helper.to_array(weight)
    assert values.dtype == ml_dtypes.float8_e4m3fn
    assert float(np.abs(values.astype(np.float32)).max()) == 448.0  # each channel's largest weight maps to 448


def test_keep_fp32_and_activation_matmuls_are_skipped_with_reasons() -> None:
    model = conv_gemm_model()
    graph = gs.import_onnx(model)
    targets, skipped = plan_targets(graph, ("node:gemm", "op:MatMul"))
    assert [t.node for t in targets] == ["conv"]
    assert {s.node: s.reason for s in skipped} == {
        "gemm": "keep_fp32 entry 'node:gemm'",
        "matmul": "keep_fp32 entry 'op:MatMul'",
    }
    attention = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"], name="scores")],
        "a",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 2])],
    )
    targets, skipped = plan_targets(gs.import_onnx(helper.make_model(attention)))
    assert not targets and skipped[0].reason == "both inputs are activations (no constant weight)"


def test_an_opset_before_float8_is_an_error_with_the_fix() -> None:
    graph = gs.import_onnx(conv_gemm_model(opset=17))
    targets, _ = plan_targets(graph)
    with pytest.raises(ConversionError, match="opset >= 19") as info:
        quantize_graph(graph, FORMATS["fp8"], targets, {"conv": 1.0, "gemm": 1.0, "matmul": 1.0})
    assert "fix:" in str(info.value)
