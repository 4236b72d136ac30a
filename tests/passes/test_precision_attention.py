"""The precision rewrite around attention and normalizations, held to the real TensorRT-RTX builder.

Two things the float16 decoders (GPT-2, Llama) needed: the cast that narrows a float32 island's result sits at the
island's edge, before the followers (TensorRT-RTX's attention fusion rejects ``NaN guard (float32) -> Cast ->
MatMul``), and the residual stream a normalization reads stays float32.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from rtx_build import rtx_build_error

from converters.settings import Settings
from passes import to_graph, to_model
from passes.precision.convert import ConvertPrecision, plan_precision
from pipeline.runtime.ort.half_emulation import emulate_low_precision

RNG = np.random.default_rng(0)
HEADS, SEQ, DIM = 2, 8, 16


def attention_with_nan_guard() -> onnx.ModelProto:
    """What torch's scaled_dot_product_attention exports for a causal decoder: scores + a float32 mask holding
    finfo(float32).min, Softmax, the NaN guard ``Where(IsNaN(p), 0, p)``, then the MatMul with V."""
    mask = np.triu(np.full((SEQ, SEQ), np.finfo(np.float32).min, np.float32), 1)
    nodes = [
        helper.make_node("MatMul", ["q", "k_t"], ["scores"], name="qk"),
        helper.make_node("Add", ["scores", "mask"], ["masked"], name="add_mask"),
        helper.make_node("Softmax", ["masked"], ["p"], name="softmax", axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"], name="isnan"),
        helper.make_node("Where", ["nan", "zero", "p"], ["guarded"], name="guard"),
        helper.make_node("MatMul", ["guarded", "v"], ["y"], name="pv"),
    ]
    inits = [
        numpy_helper.from_array(mask.reshape(1, 1, SEQ, SEQ), "mask"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    inputs = [
        helper.make_tensor_value_info("q", T.FLOAT, [1, HEADS, SEQ, DIM]),
        helper.make_tensor_value_info("k_t", T.FLOAT, [1, HEADS, DIM, SEQ]),
        helper.make_tensor_value_info("v", T.FLOAT, [1, HEADS, SEQ, DIM]),
    ]
    output = helper.make_tensor_value_info("y", T.FLOAT, [1, HEADS, SEQ, DIM])
    graph = helper.make_graph(nodes, "attention", inputs, [output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def convert(source: onnx.ModelProto, **settings: object) -> onnx.ModelProto:
    graph, metadata = to_graph(source)
    result = ConvertPrecision()(graph, Settings(**settings))  # type: ignore[arg-type]
    out = to_model(result.graph, source, metadata)
    onnx.checker.check_model(out, full_check=True)
    return out


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model).graph
    return {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *inferred.input, *inferred.output]}


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feed)[0])


def test_the_nan_guard_after_a_float32_softmax_runs_float16_and_the_real_builder_builds_it() -> None:
    source = attention_with_nan_guard()
    out = convert(source, precision="fp16")
    types = tensor_types(out)
    producer = {o: n for n in out.graph.node for o in n.output}
    guard = next(n for n in out.graph.node if n.name == "guard")
    assert types["p"] == T.FLOAT  # Softmax reads the float32 mask: a float32 island
    assert types["guarded"] == T.FLOAT16  # the guard follows its consumer, the float16 MatMul
    cast = producer[guard.input[2]]
    assert cast.op_type == "Cast" and cast.input[0] == "p"  # the cast sits at the island's edge
    feed = {
        name: RNG.standard_normal(shape).astype(np.float32)
        for name, shape in (("q", (1, HEADS, SEQ, DIM)), ("k_t", (1, HEADS, DIM, SEQ)), ("v", (1, HEADS, SEQ, DIM)))
    }
    np.testing.assert_allclose(run(emulate_low_precision(out), feed), run(source, feed), atol=1e-2, rtol=1e-2)
    assert rtx_build_error(source) is None
    assert rtx_build_error(out) is None


def test_the_builder_rejects_a_float32_nan_guard_cast_into_a_float16_matmul() -> None:
    """The precise trigger, kept as evidence: the guard in float32 (here by keep_fp32) with the Cast after it."""
    out = convert(attention_with_nan_guard(), precision="fp16", keep_fp32=("node:guard",))
    assert tensor_types(out)["guarded"] == T.FLOAT
    error = rtx_build_error(out)
    assert error is not None and "mha_fusion" in error, error


def residual_blocks() -> onnx.ModelProto:
    """x -> Gemm -> (+ x: residual) -> LayerNorm -> Gemm -> (+ bias) -> decomposed RMSNorm of (+ residual)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "x"], ["r1"], name="residual1"),
        helper.make_node("LayerNormalization", ["r1", "g", "b"], ["n1"], name="ln", axis=-1),
        helper.make_node("MatMul", ["n1", "w2"], ["h2"], name="fc2"),
        helper.make_node("Add", ["h2", "bias"], ["h2b"], name="add_bias"),
        helper.make_node("Relu", ["h2b"], ["a2"], name="relu"),
        helper.make_node("Add", ["a2", "r1"], ["r2"], name="residual2"),
        helper.make_node("Mul", ["r2", "r2"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean_square"),
        helper.make_node("Add", ["ms", "eps"], ["ms_eps"], name="add_eps"),
        helper.make_node("Sqrt", ["ms_eps"], ["rms"], name="sqrt"),
        helper.make_node("Div", ["r2", "rms"], ["y"], name="normalize"),
    ]
    inits = [
        numpy_helper.from_array((RNG.standard_normal((8, 8)) * 0.3).astype(np.float32), "w1"),
        numpy_helper.from_array((RNG.standard_normal((8, 8)) * 0.3).astype(np.float32), "w2"),
        numpy_helper.from_array(np.ones(8, np.float32), "g"),
        numpy_helper.from_array(np.zeros(8, np.float32), "b"),
        numpy_helper.from_array(np.full(8, 0.1, np.float32), "bias"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_the_residual_stream_a_normalization_reads_stays_float32() -> None:
    graph, _ = to_graph(residual_blocks())
    plan = plan_precision(graph, Settings(precision="fp16"))
    residual = {i.node for i in plan.islands if i.reason.startswith("residual stream")}
    assert residual == {"residual1", "residual2"}  # not add_bias, which feeds Relu
    assert {"fc1", "fc2", "add_bias", "relu"} <= plan.low_nodes
    out = convert(residual_blocks(), precision="fp16")
    assert rtx_build_error(out) is None


def test_residual_rule_is_an_accuracy_rule() -> None:
    graph, _ = to_graph(residual_blocks())
    plan = plan_precision(graph, Settings(precision="fp16", precision_rules=False))
    assert not any(i.reason.startswith("residual stream") for i in plan.islands)
    assert {"residual1", "residual2"} <= plan.low_nodes
