"""The precision pass on small graphs: types, islands, casts, numbers on ONNX Runtime, and what TensorRT parses."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from rtx_build import rtx_build_error

from converters.settings import Settings
from passes import PassManager, TopologicalSort, to_graph, to_model
from passes.precision.convert import ConvertPrecision, plan_precision
from passes.records import Island
from pipeline.runtime.ort.half_emulation import emulate_low_precision

RNG = np.random.default_rng(0)


def weight(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[int | str]]],
    outputs: dict[str, list[int | str]],
    initializers: list[onnx.TensorProto] = (),  # type: ignore[assignment]
    opset: int = 20,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, T.FLOAT, shape) for n, shape in outputs.items()],
        list(initializers),
    )
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    built.ir_version = 10
    return built


def convert(source: onnx.ModelProto, islands: tuple[Island, ...] = (), **settings: object) -> onnx.ModelProto:
    graph, metadata = to_graph(source)
    result = ConvertPrecision(islands)(graph, Settings(**settings))  # type: ignore[arg-type]
    assert result.modified
    out = to_model(result.graph, source, metadata)
    onnx.checker.check_model(out, full_check=True)
    return out


def run(source: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def types(source: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(source).graph
    return {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *inferred.output, *inferred.input]}


def op_types(source: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in source.graph.node]


def trt_rejects(source: onnx.ModelProto) -> list[str]:
    """The static TensorRT parser check (pipeline.compatibility.static) on the final graph."""
    from pipeline.compatibility.static import check

    return [f"{p.op} {p.node}: {p.reason}" for p in check(source).problems]


# -- a plain MLP: everything low, casts only at the boundary ---------------------------------------------------------


def mlp() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    inits = [weight("w1", 8, 16), weight("b1", 16), weight("w2", 16, 4)]
    return model(nodes, [("x", T.FLOAT, ["batch", 8])], {"y": ["batch", 4]}, inits)


@pytest.mark.parametrize(("precision", "onnx_type", "atol"), [("fp16", T.FLOAT16, 5e-3), ("bf16", T.BFLOAT16, 5e-2)])
def test_mlp_computes_low_with_casts_only_at_the_boundary(precision: str, onnx_type: int, atol: float) -> None:
    source = mlp()
    out = convert(source, precision=precision)
    assert op_types(out) == ["Cast", "MatMul", "Add", "Relu", "MatMul", "Cast"]
    inferred = types(out)
    assert inferred["x"] == inferred["y"] == T.FLOAT  # graph inputs and outputs keep their types
    assert all(inferred[t] == onnx_type for t in ("h", "hb", "r"))
    assert {i.name: i.data_type for i in out.graph.initializer} == {"w1": onnx_type, "b1": onnx_type, "w2": onnx_type}
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"  # dynamic dims kept
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    want = run(source, {"x": x})[0]
    np.testing.assert_allclose(run(emulate_low_precision(out), {"x": x})[0], want, atol=atol, rtol=atol)
    if precision == "fp16":  # the float16 graph itself runs on ONNX Runtime's CPU provider too
        np.testing.assert_allclose(run(out, {"x": x})[0], want, atol=atol, rtol=atol)
    assert trt_rejects(out) == []


def test_fp32_is_a_no_op_and_a_converted_graph_is_not_converted_twice() -> None:
    graph, _ = to_graph(mlp())
    assert not ConvertPrecision()(graph, Settings()).modified
    manager = PassManager([ConvertPrecision(), TopologicalSort()], max_iterations=3)
    _, records = manager.run(graph, Settings(precision="fp16"))
    assert [(r.name, r.iteration) for r in records if r.name == "precision" and r.modified] == [("precision", 0)]


# -- casts: a graph built to need many ---------------------------------------------------------------------------


def many_casts() -> onnx.ModelProto:
    """Islands (LayerNormalization) between low MatMuls, Reshape/Transpose between them, a fan-out, an integer mask
    cast to float, two graph outputs (one from an island's follower, one from a low node)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
        helper.make_node("LayerNormalization", ["m1", "g", "b"], ["n1"], name="ln1", axis=-1),
        helper.make_node("Reshape", ["n1", "shape"], ["r1"], name="reshape"),
        helper.make_node("Transpose", ["r1"], ["t1"], name="transpose", perm=[0, 1, 2]),
        helper.make_node("MatMul", ["t1", "w2"], ["m2"], name="fc2"),
        helper.make_node("MatMul", ["t1", "w3"], ["m3"], name="fc3"),
        helper.make_node("Cast", ["mask"], ["mask_f"], name="mask_to_float", to=T.FLOAT),
        helper.make_node("Mul", ["m2", "mask_f"], ["masked"], name="apply_mask"),
        helper.make_node("Add", ["masked", "m3"], ["s"], name="sum"),
        helper.make_node("LayerNormalization", ["s", "g", "b"], ["n2"], name="ln2", axis=-1),
        helper.make_node("Reshape", ["n2", "shape"], ["y1"], name="out_reshape"),
        helper.make_node("MatMul", ["n2", "w4"], ["y2"], name="fc4"),
    ]
    inits = [
        weight("w1", 8, 8),
        weight("w2", 8, 8),
        weight("w3", 8, 8),
        weight("w4", 8, 4),
        numpy_helper.from_array(np.ones(8, np.float32), "g"),
        numpy_helper.from_array(np.zeros(8, np.float32), "b"),
        numpy_helper.from_array(np.array([0, 0, 8], np.int64), "shape"),
    ]
    inputs = [("x", T.FLOAT, [2, 3, 8]), ("mask", T.INT64, [2, 3, 1])]
    return model(nodes, inputs, {"y1": [2, 3, 8], "y2": [2, 3, 4]}, inits)


def test_casts_sit_at_island_boundaries_one_per_tensor() -> None:
    source = many_casts()
    out = convert(source, precision="fp16")
    casts = [n for n in out.graph.node if n.op_type == "Cast"]
    produced = {o: n for n in out.graph.node for o in n.output}
    converted = sorted(
        (produced[c.input[0]].name if c.input[0] in produced else c.input[0], c.attribute[0].i) for c in casts
    )
    assert converted == [
        ("apply_mask", T.FLOAT),  # into sum, the residual stream before ln2 (float32)
        ("fc1", T.FLOAT),  # into ln1
        ("fc3", T.FLOAT),  # into sum
        ("fc4", T.FLOAT),  # the low graph output y2 back to float32
        ("ln1", T.FLOAT16),  # at the island's edge: one cast shared by fc2 and fc3 through Reshape and Transpose
        ("ln2", T.FLOAT16),  # into fc4
        ("mask", T.FLOAT16),  # the exporter's int64 -> float cast now casts straight to float16
        ("x", T.FLOAT16),  # graph input
    ]
    inferred = types(out)
    assert inferred["n1"] == inferred["s"] == inferred["y1"] == T.FLOAT  # islands, and a float32 graph output
    assert inferred["r1"] == inferred["t1"] == T.FLOAT16  # followers whose consumers all run low run low
    assert not _cancelling_pairs(out)
    feed = {
        "x": RNG.standard_normal((2, 3, 8)).astype(np.float32),
        "mask": np.array([1, 0, 1, 1, 1, 0]).reshape(2, 3, 1),
    }
    for got, want in zip(run(emulate_low_precision(out), feed), run(source, feed), strict=True):
        np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
    assert trt_rejects(out) == []


def _cancelling_pairs(source: onnx.ModelProto) -> list[str]:
    produced = {o: n for n in source.graph.node for o in n.output}
    tensor_types = types(source)
    pairs = []
    for node in source.graph.node:
        first = produced.get(node.input[0]) if node.op_type == "Cast" else None
        if first is not None and first.op_type == "Cast" and tensor_types.get(first.input[0]) == node.attribute[0].i:
            pairs.append(f"{first.name} -> {node.name}")
    return pairs


def test_simplify_casts_cancels_exact_round_trips_merges_duplicates_and_folds_integer_chains() -> None:
    from passes.precision.casts import SimplifyCasts

    nodes = [
        helper.make_node("Cast", ["x"], ["a16"], name="down", to=T.FLOAT16),
        helper.make_node("Cast", ["x"], ["a16_again"], name="down_again", to=T.FLOAT16),  # duplicate
        helper.make_node("Cast", ["a16"], ["a32"], name="up", to=T.FLOAT),  # float16 -> float32: exact
        helper.make_node("Cast", ["a32"], ["b16"], name="down2", to=T.FLOAT16),  # cancels with "up"
        helper.make_node("Add", ["b16", "a16_again"], ["s16"], name="add"),
        helper.make_node("Cast", ["s16"], ["s32"], name="back", to=T.FLOAT),
        helper.make_node("Cast", ["x"], ["x32"], name="no_op", to=T.FLOAT),
        helper.make_node("Cast", ["i"], ["i32"], name="int_to_float", to=T.FLOAT),
        helper.make_node("Cast", ["i32"], ["i16"], name="float_to_half", to=T.FLOAT16),  # folds to int -> half
        helper.make_node("Cast", ["i16"], ["i_out"], name="half_out", to=T.FLOAT),
        helper.make_node("Add", ["x32", "x"], ["x2"], name="add_x"),
    ]
    source = model(nodes, [("x", T.FLOAT, [4]), ("i", T.INT64, [4])], {n: [4] for n in ("s32", "x2", "i_out", "a32")})
    graph, metadata = to_graph(source)
    assert SimplifyCasts()(graph, Settings()).modified
    out = to_model(graph, source, metadata)
    onnx.checker.check_model(out, full_check=True)
    names = {n.name for n in out.graph.node}
    assert names == {"down", "up", "add", "back", "float_to_half", "half_out", "add_x"}
    # "up" stays: float32 -> float16 -> float32 rounds (and a32 is a graph output); int -> float -> half is one
    # cast; int -> half -> float is not folded (the half rounds 70000 to inf and 2049 to 2048)
    assert next(n for n in out.graph.node if n.name == "float_to_half").input == ["i"]
    feed = {"x": np.array([1e5, 0.1, -3.3, 7.0], np.float32), "i": np.array([1, 70000, -3, 2049], np.int64)}
    for got, want in zip(run(out, feed), run(source, feed), strict=True):
        np.testing.assert_array_equal(got, want)  # bit for bit


# -- rules ---------------------------------------------------------------------------------------------------------


def attention_with_min_mask() -> onnx.ModelProto:
    """The transformers pattern: Where(mask, 0, finfo(float32).min) added to the scores before Softmax."""
    nodes = [
        helper.make_node("MatMul", ["q", "k"], ["scores"], name="qk"),
        helper.make_node("Where", ["keep", "zero", "minimum"], ["bias"], name="mask_bias"),
        helper.make_node("Add", ["scores", "bias"], ["masked"], name="add_bias"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="pv"),
    ]
    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "minimum"),
        weight("k", 4, 6),
        weight("v", 6, 4),
    ]
    return model(nodes, [("q", T.FLOAT, [2, 6, 4]), ("keep", T.BOOL, [2, 1, 6])], {"y": [2, 6, 4]}, inits)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_constants_beyond_the_range_keep_their_flow_in_float32(precision: str) -> None:
    source = attention_with_min_mask()
    graph, _ = to_graph(source)
    plan = plan_precision(graph, Settings(precision=precision))
    assert {i.node for i in plan.islands} == {"mask_bias", "add_bias", "softmax"}
    assert all("beyond" in i.reason for i in plan.islands)
    assert plan.low_nodes == {"qk", "pv"}
    out = convert(source, precision=precision)
    keep = np.ones((2, 1, 6), bool)
    keep[1, 0, 4:] = False
    feed = {"q": RNG.standard_normal((2, 6, 4)).astype(np.float32), "keep": keep}
    np.testing.assert_allclose(run(emulate_low_precision(out), feed)[0], run(source, feed)[0], atol=3e-2, rtol=3e-2)


def elementwise(ops: list[tuple[str, dict[str, object]]], shape: list[int | str]) -> onnx.ModelProto:
    nodes, prev = [], "x"
    for i, (op, attrs) in enumerate(ops):
        nodes.append(helper.make_node(op, [prev, *attrs.pop("inputs", [])], [f"t{i}"], name=op.lower(), **attrs))  # type: ignore[arg-type]
        prev = f"t{i}"
    nodes.append(helper.make_node("MatMul", [prev, "w"], ["y"], name="fc"))
    inits = [weight("w", 8, 8), numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    return model(nodes, [("x", T.FLOAT, shape)], {"y": [2, 8]}, inits)


def test_exp_is_an_island_in_fp16_but_not_in_bf16() -> None:
    graph, _ = to_graph(elementwise([("Exp", {})], [2, 8]))
    reasons = {i.node: i.reason for i in plan_precision(graph, Settings(precision="fp16")).islands}
    assert reasons == {"exp": "Exp overflows float16 for inputs above 11.1"}
    graph, _ = to_graph(elementwise([("Exp", {})], [2, 8]))
    assert plan_precision(graph, Settings(precision="bf16")).islands == ()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_comparison_of_floats_decides_in_float32(precision: str) -> None:
    """2049 < 2050 on the graph's float32 input; a half type rounds both to one value and the Less flips (a router
    picked other experts). The comparison keeps its inputs' float32; the MatMul beside it goes low."""
    nodes = [
        helper.make_node("Less", ["x", "limit"], ["below"], name="less"),
        helper.make_node("Cast", ["below"], ["flags"], name="to_float", to=T.FLOAT),
        helper.make_node("MatMul", ["flags", "w"], ["y"], name="fc"),
    ]
    limit = numpy_helper.from_array(np.full((1,), 2050.0, np.float32), "limit")
    eye = numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")
    source = model(nodes, [("x", T.FLOAT, [1, 2])], {"y": [1, 2]}, [eye, limit])
    graph, _ = to_graph(source)
    reasons = {i.node: i.reason for i in plan_precision(graph, Settings(precision=precision)).islands}
    assert reasons["less"].startswith("comparison:") and "fc" not in reasons
    feed = {"x": np.array([[2049.0, 2051.0]], np.float32)}
    assert run(emulate_low_precision(convert(source, precision=precision)), feed)[0].tolist() == [[1.0, 0.0]]


def test_a_router_decides_in_float32_and_a_vocabulary_projection_stays_low() -> None:
    """A mixture-of-experts gate (MatMul to 8 experts, Softmax, TopK) is kept in float32; a TopK over an LM head's
    4096-wide logits leaves the head low (only the TopK itself is kept)."""
    nodes = [
        helper.make_node("MatMul", ["x", "gate"], ["logits"], name="router"),
        helper.make_node("Softmax", ["logits"], ["scores"], name="softmax", axis=-1),
        helper.make_node("TopK", ["scores", "k"], ["top", "experts"], name="topk"),
        helper.make_node("MatMul", ["x", "head"], ["vocab"], name="lm_head"),
        helper.make_node("TopK", ["vocab", "k"], ["best", "tokens"], name="sample"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="expert"),
    ]
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    inits = [weight("gate", 16, 8), weight("head", 16, 4096), weight("w", 16, 16), k]
    source = model(nodes, [("x", T.FLOAT, [4, 16])], {"y": [4, 16], "top": [4, 2], "best": [4, 2]}, inits)
    graph, _ = to_graph(source)
    reasons = {i.node: i.reason for i in plan_precision(graph, Settings(precision="fp16")).islands}
    assert {n for n, r in reasons.items() if r.startswith("routing:")} == {"router", "softmax", "topk", "sample"}
    assert "lm_head" not in reasons and "expert" not in reasons


def test_large_reductions_count_dynamic_dims_at_their_declared_max() -> None:
    source = elementwise(
        [("ReduceSum", {"inputs": ["axes"], "keepdims": 1}), ("Expand", {"inputs": ["shape"]})], [2, "seq"]
    )
    source.graph.initializer.append(numpy_helper.from_array(np.array([2, 8], np.int64), "shape"))
    long = Settings(precision="fp16", dynamic={"x": {1: ("seq", 1, 64, 8192)}})
    short = Settings(precision="fp16", dynamic={"x": {1: ("seq", 1, 64, 512)}})
    graph, _ = to_graph(source)
    assert [i.reason for i in plan_precision(graph, long).islands] == [
        "large reduction: accumulates 8192 elements (more than 4096)"
    ]
    graph, _ = to_graph(source)
    assert plan_precision(graph, short).islands == ()


def test_decomposed_variance_is_kept_in_float32() -> None:
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], name="mean"),
        helper.make_node("Sub", ["x", "mean"], ["d"], name="center"),
        helper.make_node("Mul", ["d", "d"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], name="variance"),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="sqrt"),
        helper.make_node("Div", ["d", "std"], ["y"], name="normalize"),
    ]
    inits = [
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
    ]
    graph, _ = to_graph(model(nodes, [("x", T.FLOAT, [2, 8])], {"y": [2, 8]}, inits))
    plan = plan_precision(graph, Settings(precision="bf16"))
    assert {i.node for i in plan.islands} == {"square", "variance", "add_eps", "sqrt", "normalize"}
    assert plan.low_nodes == {"mean", "center"}


def test_shape_arithmetic_in_float_stays_float32() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Cast", ["shape"], ["shape_f"], name="to_float", to=T.FLOAT),
        helper.make_node("Mul", ["shape_f", "half"], ["scaled"], name="scale"),
        helper.make_node("Cast", ["scaled"], ["size"], name="to_int", to=T.INT64),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "size"], ["y"], name="reshape"),
    ]
    inits = [numpy_helper.from_array(np.array([2.0, 1.0], np.float32), "half")]
    graph, _ = to_graph(model(nodes, [("x", T.FLOAT, ["n", 8])], {"y": ["m", "k"]}, inits))
    plan = plan_precision(graph, Settings(precision="fp16"))
    assert {i.node: i.reason.split(":")[0] for i in plan.islands} == {"scale": "shape arithmetic"}
    assert plan.decisions["to_float"] == "fp32"  # the cast into it follows
    assert "relu" in plan.low_nodes


def test_type_rules_follow_the_onnx_opset_and_tensorrt_matrix_and_cannot_be_turned_off() -> None:
    conv = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Mish", ["c"], ["y"], name="mish"),
    ]
    inputs = [("x", T.FLOAT, [1, 2, 5, 5])]
    for opset, expected in ((20, {"conv", "mish"}), (22, {"mish"})):
        graph, _ = to_graph(model(conv, inputs, {"y": [1, 3, 3, 3]}, [weight("w", 3, 2, 3, 3)], opset=opset))
        plan = plan_precision(graph, Settings(precision="bf16", precision_rules=False))
        reasons = {i.node: i.reason for i in plan.islands}
        assert set(reasons) == expected
    assert reasons["mish"] == "TensorRT's ONNX parser does not take Mish in BF16"
    graph, _ = to_graph(model(conv, inputs, {"y": [1, 3, 3, 3]}, [weight("w", 3, 2, 3, 3)], opset=20))
    conv_reason = {i.node: i.reason for i in plan_precision(graph, Settings(precision="bf16")).islands}["conv"]
    assert conv_reason == "ONNX opset 20's Conv does not take bfloat16 (opset 22 does: export with opset=22)"
    graph, _ = to_graph(model(conv, inputs, {"y": [1, 3, 3, 3]}, [weight("w", 3, 2, 3, 3)], opset=20))
    assert plan_precision(graph, Settings(precision="fp16")).islands == ()


# -- user islands ----------------------------------------------------------------------------------------------------


def scoped(source: onnx.ModelProto, scopes: dict[str, list[str]]) -> onnx.ModelProto:
    """Give nodes the exporter's module-path metadata."""
    for node in source.graph.node:
        if node.name in scopes:
            node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=repr(["", *scopes[node.name], node.name]))
    return source


def test_keep_fp32_matches_node_names_op_types_and_module_paths() -> None:
    source = scoped(mlp(), {"fc1": ["blocks.0", "blocks.0.fc"], "bias1": ["blocks.0", "blocks.0.fc"], "fc2": ["head"]})
    cases = {
        ("node:relu",): {"relu"},
        ("op:MatMul",): {"fc1", "fc2"},
        ("blocks.0",): {"fc1", "bias1"},
        ("module:blocks",): {"fc1", "bias1"},  # a module holds the modules inside it
        ("module:block",): set(),  # ... matched on whole path components
        ("head", "Relu"): {"fc2", "relu"},
    }
    for entries, expected in cases.items():
        graph, _ = to_graph(source)
        plan = plan_precision(graph, Settings(precision="fp16", keep_fp32=entries))
        assert {i.node for i in plan.islands} == expected, entries
        assert all(i.source == "user" for i in plan.islands)
    assert plan_precision(to_graph(source)[0], Settings(precision="fp16", keep_fp32=("block",))).unmatched == ("block",)
    island = next(
        i for i in plan_precision(to_graph(source)[0], Settings(precision="fp16", keep_fp32=("head",))).islands
    )
    assert (island.module, island.reason) == ("head", "keep_fp32 entry 'head'")


def test_extra_islands_from_the_pipeline_keep_their_source_and_reason() -> None:
    out = convert(mlp(), (Island("relu", "Relu", "measured", "produces 'r' beyond range"),), precision="fp16")
    assert types(out)["r"] == T.FLOAT
    assert Counter(op_types(out))["Cast"] == 4  # x in, hb out to the island, r back in, y out


def masked_logits() -> onnx.ModelProto:
    """Logits masked with finfo(float32).min where ``keep`` is False (Chameleon's image tokens)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["scores"], name="fc"),
        helper.make_node("Where", ["keep", "scores", "minimum"], ["logits"], name="mask_logits"),
    ]
    inits = [weight("w", 8, 8), numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "minimum")]
    return model(nodes, [("x", T.FLOAT, [2, 8]), ("keep", T.BOOL, [2, 8])], {"logits": [2, 8]}, inits)


def test_an_output_in_the_low_type_saturates_where_a_float32_island_masks_it() -> None:
    """Chameleon masks its image tokens' logits with finfo(float32).min: that Where stays float32, and the logits
    output in float16 (``precision_io="low"``) was a plain cast of it, ``-inf``; the model in float16 writes float16's
    lowest value. The cast now saturates: the masked logits are -65504, the others as a cast gives them."""
    source = masked_logits()
    out = convert(source, precision="fp16", precision_io="low")
    keep = np.ones((2, 8), bool)
    keep[:, 5:] = False
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    (logits,) = run(out, {"x": x.astype(np.float16), "keep": keep})
    assert logits.dtype == np.float16 and np.isfinite(logits).all()
    np.testing.assert_array_equal(logits[:, 5:], np.float16(-65504.0))
    np.testing.assert_allclose(logits[:, :5], run(source, {"x": x, "keep": keep})[0][:, :5], atol=0.05, rtol=0.02)


def test_tensorrt_rtx_builds_the_saturating_output_cast() -> None:
    out = convert(masked_logits(), precision="fp16", precision_io="low")
    assert [n.op_type for n in out.graph.node if n.op_type in ("Clip", "Cast")][-2:] == ["Clip", "Cast"]
    error = rtx_build_error(out)
    assert error is None, error
