"""Why half-precision graphs run as an emulation on ONNX Runtime's CPU provider, and that the emulation rounds
exactly where the real graph does."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from pipeline.runtime.ort.half_emulation import emulate_low_precision, has_low_precision


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def half_graph(half: int, weight: np.ndarray) -> onnx.ModelProto:
    """x -> Cast(half) -> Gemm(half weights) -> LayerNormalization(half) -> Gemm -> Cast(float) -> y."""
    dtype = np.float16 if half == T.FLOAT16 else ml_dtypes.bfloat16
    width = weight.shape[1]
    nodes = [
        helper.make_node("Cast", ["x"], ["xh"], to=half, name="in"),
        helper.make_node("Gemm", ["xh", "w"], ["h"], name="gemm"),
        helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], axis=-1, name="ln"),
        helper.make_node("Gemm", ["n", "eye"], ["o"], name="head"),
        helper.make_node("Cast", ["o"], ["y"], to=T.FLOAT, name="out"),
    ]
    inits = [
        numpy_helper.from_array(weight.astype(dtype), "w"),
        numpy_helper.from_array(np.ones(width, dtype), "g"),
        numpy_helper.from_array(np.zeros(width, dtype), "b"),
        numpy_helper.from_array(np.eye(width).astype(dtype), "eye"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, weight.shape[0]])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    return model


def test_onnx_runtime_drops_float16_roundings_the_emulation_keeps() -> None:
    """A float16 Gemm output of ~1e5 is inf in float16 (and in TensorRT); ONNX Runtime's CPU provider, which runs
    Gemm in float32 between casts it inserts and then removes, runs the LayerNormalization between two Gemms in
    float32 as well and never sees the inf."""
    weight = np.linspace(0.0, 3.0e4, 32, dtype=np.float32).reshape(4, 8)  # column sums up to 7.4e4
    x = np.ones((2, 4), np.float32)
    model = half_graph(T.FLOAT16, weight)
    onnx.checker.check_model(model, full_check=True)
    assert np.isfinite(run(model, {"x": x})).all()  # the native run hides the overflow
    emulated = emulate_low_precision(model)
    onnx.checker.check_model(emulated, full_check=True)
    assert {t.data_type for t in emulated.graph.initializer} == {T.FLOAT}  # weights widened exactly
    assert np.isnan(run(emulated, {"x": x})).all()  # inf - inf in the normalization, as on TensorRT


def test_bfloat16_emulation_rounds_every_tensor_like_ml_dtypes() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 8)).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    model = half_graph(T.BFLOAT16, weight)
    onnx.checker.check_model(model, full_check=True)
    assert has_low_precision(model)
    bf16 = ml_dtypes.bfloat16
    h = (x.astype(bf16).astype(np.float32) @ weight.astype(bf16).astype(np.float32)).astype(bf16).astype(np.float32)
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    want = ((h - mean) / np.sqrt(var + 1e-5)).astype(bf16).astype(np.float32)  # times the identity "head"
    np.testing.assert_allclose(run(emulate_low_precision(model), {"x": x}), want, rtol=1e-2, atol=1e-2)
    got = run(emulate_low_precision(model), {"x": x})
    np.testing.assert_array_equal(got, got.astype(bf16).astype(np.float32))  # every value is a bfloat16 value
