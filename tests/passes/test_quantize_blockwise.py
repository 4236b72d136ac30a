"""The 4-bit weight formats and rewrite (passes/quantize/blockwise.py, weight_only.py): the stored values decode
to what numpy computes, on ONNX Runtime (INT4) and on ONNX's reference implementation (NVFP4, which ONNX Runtime
cannot run; the emulation must match it bit for bit), and the real TensorRT-RTX builder takes each graph for the
compute capabilities its format needs and refuses it for older ones."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from quantize_support import build_with_tensorrt_rtx

from passes import to_graph, to_model
from passes.quantize.blockwise import BLOCK_FORMATS, dequantize, fake_quantize, quantize_int4, quantize_nvfp4
from passes.quantize.placement import plan_targets
from passes.quantize.weight_only import blockable, quantize_weights
from pipeline.runtime.ort.emulation import emulate_fp4

K, N = 256, 96


def linear_graph(opset: int, float_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """x [B, 8, K] -> MatMul(w1 [K, K]) -> Relu -> MatMul(w2 [K, N]): two MatMuls with constant weights."""
    rng = np.random.default_rng(0)
    dtype = helper.tensor_dtype_to_np_dtype(float_type)
    w1 = numpy_helper.from_array((rng.standard_normal((K, K)) * 0.05).astype(dtype), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((K, N)) * 0.05).astype(dtype), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", float_type, ["B", 8, K])],
        [helper.make_tensor_value_info("y", float_type, ["B", 8, N])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def quantized(model: onnx.ModelProto, precision: str, block: int = 128) -> onnx.ModelProto:
    graph, metadata = to_graph(model)
    targets, _ = plan_targets(graph)
    targets, skipped = blockable(targets, graph, block)
    assert not skipped and len(targets) == 2
    weights = {t.node: np.asarray(gs_weight(graph, t.node), np.float32) for t in targets}
    done = quantize_weights(graph, BLOCK_FORMATS[precision], targets, weights, block)
    assert {op.node for op in done} == {"mm1", "mm2"}
    return to_model(graph, model, metadata)


def gs_weight(graph: gs.Graph, node: str) -> np.ndarray:
    return next(n for n in graph.nodes if n.name == node).inputs[1].values


def test_int4_block_scales_bound_the_rounding_error() -> None:
    weight = np.random.default_rng(1).standard_normal((N, K)).astype(np.float32)
    q = quantize_int4(weight, 64)
    assert q.values.dtype == ml_dtypes.int4 and q.scales.shape == (N, K // 64)
    blocks = np.abs(weight.reshape(N, K // 64, 64)).max(axis=2)
    np.testing.assert_allclose(q.scales, blocks / 7, rtol=1e-6)  # symmetric: the block's max maps to 7
    error = np.abs(dequantize(q) - weight).reshape(N, K // 64, 64).max(axis=2)
    assert np.all(error <= q.scales / 2 + 1e-7)


def test_nvfp4_is_two_level_with_fp8_block_scales() -> None:
    weight = np.random.default_rng(2).standard_normal((N, K)).astype(np.float32)
    q = quantize_nvfp4(weight)
    assert q.values.dtype == ml_dtypes.float4_e2m1fn and q.scales.dtype == ml_dtypes.float8_e4m3fn
    assert q.scales.shape == (N, K // 16) and q.scale2 == pytest.approx(np.abs(weight).max() / (6 * 448))
    block_scales = q.scales.astype(np.float32) * np.float32(q.scale2)
    scaled = weight.reshape(N, K // 16, 16) / block_scales[:, :, None]
    want = scaled.astype(ml_dtypes.float4_e2m1fn).reshape(N, K)  # ml_dtypes' rounding: nearest, ties to even
    np.testing.assert_array_equal(q.values.astype(np.float32), want.astype(np.float32))
    np.testing.assert_array_equal(fake_quantize(BLOCK_FORMATS["nvfp4"], weight, 16), dequantize(q))
    relative = np.linalg.norm(dequantize(q) - weight) / np.linalg.norm(weight)
    assert 0.02 < relative < 0.15  # 4 bits per value: a few percent, not exact and not broken


@pytest.mark.parametrize("float_type", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_int4_graph_runs_on_onnx_runtime_as_numpy_computes_it(float_type: int) -> None:
    model = linear_graph(21, float_type)
    rewritten = quantized(model, "int4")
    onnx.checker.check_model(rewritten, full_check=True)
    dqs = [n for n in rewritten.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dqs) == 2 and all({a.name for a in n.attribute} == {"axis", "block_size"} for n in dqs)
    assert all(len(n.input) == 2 for n in dqs)  # no zero point: TensorRT rejects non-zero ones
    x = np.random.default_rng(3).standard_normal((2, 8, K)).astype(helper.tensor_dtype_to_np_dtype(float_type))
    reference = ReferenceEvaluator(rewritten).run(None, {"x": x})
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    got = ort.InferenceSession(rewritten.SerializeToString(), options).run(None, {"x": x})
    tolerance = 1e-5 if float_type == TensorProto.FLOAT else 2e-2
    np.testing.assert_allclose(got[0].astype(np.float32), reference[0].astype(np.float32), atol=tolerance, rtol=0)


def test_nvfp4_emulation_matches_the_onnx_reference_bit_for_bit() -> None:
    rewritten = quantized(linear_graph(23), "nvfp4")
    onnx.checker.check_model(rewritten, full_check=True)
    assert sum(t.data_type == TensorProto.FLOAT4E2M1 for t in rewritten.graph.initializer) == 2
    x = np.random.default_rng(4).standard_normal((2, 8, K)).astype(np.float32)
    want = ReferenceEvaluator(rewritten).run(None, {"x": x})[0]  # the ONNX spec's own FP4 DequantizeLinear
    with pytest.raises(Exception, match="Could not find an implementation for DequantizeLinear"):
        ort.InferenceSession(rewritten.SerializeToString())  # why the emulation exists
    emulated = emulate_fp4(rewritten)
    assert not any(t.data_type == TensorProto.FLOAT4E2M1 for t in emulated.graph.initializer)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(emulated.SerializeToString(), options).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("precision", "opset", "builds", "refuses"),
    [("int4", 21, ("8.0", "8.9", "12.0"), "7.5"), ("nvfp4", 23, ("12.0",), "8.9")],
)
def test_tensorrt_rtx_builds_the_4bit_graph_for_its_targets_only(
    precision: str, opset: int, builds: tuple[str, ...], refuses: str
) -> None:
    rewritten = quantized(linear_graph(opset, TensorProto.FLOAT16), precision)
    assert build_with_tensorrt_rtx(rewritten, capabilities=builds) > 0
    with pytest.raises(AssertionError, match="builder failed"):
        build_with_tensorrt_rtx(rewritten, capabilities=(refuses,))
