"""Control flow under the precision pass: a Loop, If or Scan stays float32 with its bodies whole (an island), and the
values its bodies read from the outer graph by name, which the rest of the graph turns low, are cast back to float32.

Small graphs written with onnx.helper, the pass, then what a user checks: the full ONNX checker, ONNX Runtime
running the graph and matching the float32 graph within the low type's tolerance, the outside compute in the low
type, every body value in float32, and the real TensorRT-RTX parser and builder.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from rtx_build import rtx_build_error

import pipeline
from converters.settings import Settings
from passes import to_graph, to_model
from passes.precision.control_flow import outer_references
from passes.precision.convert import ConvertPrecision, plan_precision
from pipeline.runtime.ort.half_emulation import emulate_low_precision

LOW = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}
RNG = np.random.default_rng(16)
FEED = {"x": (RNG.standard_normal((2, 4)) * 0.5).astype(np.float32)}


def const(name: str, value: object, dtype: type = np.float32) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype)), name=name)


def weight(name: str) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal((4, 4)) * 0.4).astype(np.float32), name)


def body(
    name: str, nodes: list[onnx.NodeProto], inputs: list[tuple[str, int]], outputs: list[tuple[str, int]]
) -> onnx.GraphProto:
    """A subgraph; a Loop's iteration number ``i`` and condition ``cond`` are scalars (ONNX Runtime needs it)."""
    return helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, [] if n in ("i", "cond") else None) for n, t in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
    )


def model(middle: list[onnx.NodeProto], result: str, result_type: int = T.FLOAT) -> onnx.ModelProto:
    """``h = x @ w1`` (low outside), then ``middle`` (the control flow, reading ``h`` by name), then
    ``y = result @ w2`` when ``result`` is float (low outside again)."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"), *middle]
    if result_type == T.FLOAT:
        nodes.append(helper.make_node("MatMul", [result, "w2"], ["y"], name="fc2"))
    else:
        nodes.append(helper.make_node("Identity", [result], ["y"], name="out"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", result_type, [2, 4] if result_type == T.FLOAT else [])],
        [weight("w1"), weight("w2")],
    )
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    built.ir_version = 10
    onnx.checker.check_model(built, full_check=True)
    return built


def loop_reading_outer() -> onnx.ModelProto:
    """Three steps of ``acc = acc * h + 1``: ``h`` comes from outside by name, ``acc`` starts at ``h + x`` (an
    explicit input computed low)."""
    step = body(
        "step",
        [
            helper.make_node("Identity", ["cond"], ["cond_out"], name="keep_going"),
            helper.make_node("Mul", ["acc", "h"], ["scaled"], name="scale"),
            const("one", 1.0),
            helper.make_node("Add", ["scaled", "one"], ["acc_out"], name="shift"),
        ],
        [("i", T.INT64), ("cond", T.BOOL), ("acc", T.FLOAT)],
        [("cond_out", T.BOOL), ("acc_out", T.FLOAT)],
    )
    middle = [
        helper.make_node("Add", ["h", "x"], ["start"], name="start"),
        const("trips", 3, np.int64),
        const("go", True, np.bool_),
        helper.make_node("Loop", ["trips", "go", "start"], ["final"], body=step, name="recurrence"),
    ]
    return model(middle, "final")


def if_reading_outer() -> onnx.ModelProto:
    """``sum(x) > 0 ? h * 2 : h + x`` with both branches reading ``h`` (and ``x``) from outside."""
    then = body("then", [const("two", 2.0), helper.make_node("Mul", ["h", "two"], ["t"], name="double")], [], [])
    then.output.extend([helper.make_tensor_value_info("t", T.FLOAT, None)])
    other = body("else", [helper.make_node("Add", ["h", "x"], ["e"], name="shift_by_x")], [], [("e", T.FLOAT)])
    middle = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="total"),
        const("zero", 0.0),
        helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
        helper.make_node("If", ["positive"], ["chosen"], then_branch=then, else_branch=other, name="choose"),
    ]
    return model(middle, "chosen")


def scan_reading_outer() -> onnx.ModelProto:
    """A running sum over the rows of ``h + x``, each row scaled by the first row of ``h`` (read from outside)."""
    step = body(
        "row",
        [
            const("first", [0], np.int64),
            helper.make_node("Gather", ["h", "first"], ["h0"], axis=0, name="first_row"),
            helper.make_node("Reshape", ["h0", "flat"], ["h0_flat"], name="flatten"),
            helper.make_node("Mul", ["r", "h0_flat"], ["weighted"], name="weigh"),
            helper.make_node("Add", ["s", "weighted"], ["s_out"], name="accumulate"),
            helper.make_node("Identity", ["s_out"], ["each"], name="emit"),
        ],
        [("s", T.FLOAT), ("r", T.FLOAT)],
        [("s_out", T.FLOAT), ("each", T.FLOAT)],
    )
    middle = [
        helper.make_node("Add", ["h", "x"], ["rows"], name="rows"),
        const("flat", [4], np.int64),
        const("state", np.zeros(4)),
        helper.make_node("Scan", ["state", "rows"], ["sum", "sums"], body=step, num_scan_inputs=1, name="running"),
    ]
    return model(middle, "sums")


def loop_in_if() -> onnx.ModelProto:
    """An If whose then-branch computes ``g = h * 2`` and runs a Loop reading ``g`` (the branch's value) and ``h``
    (the outer graph's) by name; the else-branch negates ``h``."""
    step = body(
        "step",
        [
            helper.make_node("Identity", ["cond"], ["cond_out"], name="keep_going"),
            helper.make_node("Mul", ["acc", "g"], ["scaled"], name="scale"),
            helper.make_node("Add", ["scaled", "h"], ["acc_out"], name="shift"),
        ],
        [("i", T.INT64), ("cond", T.BOOL), ("acc", T.FLOAT)],
        [("cond_out", T.BOOL), ("acc_out", T.FLOAT)],
    )
    then = body(
        "then",
        [
            const("two", 2.0),
            helper.make_node("Mul", ["h", "two"], ["g"], name="double"),
            const("trips", 2, np.int64),
            const("go", True, np.bool_),
            helper.make_node("Loop", ["trips", "go", "g"], ["t"], body=step, name="inner_loop"),
        ],
        [],
        [("t", T.FLOAT)],
    )
    other = body("else", [helper.make_node("Neg", ["h"], ["e"], name="negate")], [], [("e", T.FLOAT)])
    middle = [
        helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0, name="top"),
        const("zero", 0.0),
        helper.make_node("Greater", ["top", "zero"], ["positive"], name="positive"),
        helper.make_node("If", ["positive"], ["chosen"], then_branch=then, else_branch=other, name="choose"),
    ]
    return model(middle, "chosen")


def nested_reading_outer() -> onnx.ModelProto:
    """A Loop whose body holds an If whose branch reads ``h`` two scopes out."""
    then = body("then", [helper.make_node("Mul", ["acc", "h"], ["t"], name="times_h")], [], [("t", T.FLOAT)])
    other = body("else", [helper.make_node("Sub", ["acc", "h"], ["e"], name="minus_h")], [], [("e", T.FLOAT)])
    step = body(
        "step",
        [
            helper.make_node("Identity", ["cond"], ["cond_out"], name="keep_going"),
            const("zero_i", 0, np.int64),
            helper.make_node("Equal", ["i", "zero_i"], ["first"], name="is_first"),
            helper.make_node("If", ["first"], ["acc_out"], then_branch=then, else_branch=other, name="branch"),
        ],
        [("i", T.INT64), ("cond", T.BOOL), ("acc", T.FLOAT)],
        [("cond_out", T.BOOL), ("acc_out", T.FLOAT)],
    )
    middle = [
        const("trips", 2, np.int64),
        const("go", True, np.bool_),
        helper.make_node("Loop", ["trips", "go", "x"], ["final"], body=step, name="outer_loop"),
    ]
    return model(middle, "final")


def counting_loop() -> onnx.ModelProto:
    """A Loop with no float input or output: it counts the positive values of ``h`` (read from outside)."""
    step = body(
        "count",
        [
            helper.make_node("Identity", ["cond"], ["cond_out"], name="keep_going"),
            const("zero", 0.0),
            helper.make_node("Greater", ["h", "zero"], ["positive"], name="positive"),
            helper.make_node("Cast", ["positive"], ["ones"], to=T.INT64, name="as_int"),
            helper.make_node("ReduceSum", ["ones"], ["found"], keepdims=0, name="count"),
            helper.make_node("Add", ["n", "found"], ["n_out"], name="add"),
        ],
        [("i", T.INT64), ("cond", T.BOOL), ("n", T.INT64)],
        [("cond_out", T.BOOL), ("n_out", T.INT64)],
    )
    middle = [
        const("trips", 2, np.int64),
        const("go", True, np.bool_),
        const("none", 0, np.int64),
        helper.make_node("Loop", ["trips", "go", "none"], ["total"], body=step, name="counter"),
    ]
    return model(middle, "total", T.INT64)


GRAPHS = {
    "loop": (loop_reading_outer, "recurrence"),
    "if": (if_reading_outer, "choose"),
    "loop_in_if": (loop_in_if, "choose"),
    "scan": (scan_reading_outer, "running"),
    "nested": (nested_reading_outer, "outer_loop"),
    "no_float_io": (counting_loop, "counter"),
}


def run(source: onnx.ModelProto) -> np.ndarray:
    session = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, FEED)[0])


def convert(source: onnx.ModelProto, precision: str) -> onnx.ModelProto:
    graph, metadata = to_graph(source)
    result = ConvertPrecision()(graph, Settings(precision=precision))  # type: ignore[arg-type]
    assert result.modified
    out = to_model(result.graph, source, metadata)
    onnx.checker.check_model(out, full_check=True)
    return out


def value_types(source: onnx.ModelProto) -> dict[str, int]:
    """The element type of every value, in the graph and in its subgraphs at any depth (names are unique)."""
    inferred = onnx.shape_inference.infer_shapes(source, strict_mode=True)
    found: dict[str, int] = {}

    def visit(graph: onnx.GraphProto) -> None:
        found.update({v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]})
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g)

    visit(inferred.graph)
    return found


def body_values(source: onnx.ModelProto, op: str) -> set[str]:
    """The names of the values inside the subgraphs of the ``op`` nodes (at any depth)."""
    names: set[str] = set()

    def visit(graph: onnx.GraphProto, inside: bool) -> None:
        for node in graph.node:
            if inside:
                names.update(node.output)
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g, inside or node.op_type == op)

    visit(source.graph, False)
    return names


def float_types(source: onnx.ModelProto, names: set[str]) -> set[int]:
    types = value_types(source)
    return {types[n] for n in names if n in types} & {T.FLOAT, T.FLOAT16, T.BFLOAT16}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", sorted(GRAPHS))
def test_control_flow_runs_float32_bodies_and_matches_float32(kind: str, precision: str) -> None:
    build, node = GRAPHS[kind]
    source = build()
    out = convert(source, precision)
    assert any(n.op_type == "MatMul" and n.name == "fc1" for n in out.graph.node)
    assert value_types(out)["h"] == LOW[precision], "the MatMul outside the control flow computes in the low type"
    inside = body_values(out, "Loop") | body_values(out, "Scan") | body_values(out, "If")
    assert float_types(out, inside) == {T.FLOAT}, "every value inside the bodies stays float32"
    # ONNX Runtime's CPU provider has float16 kernels but no bfloat16 MatMul: bf16 runs as float32 rounding to it
    got, want = run(out if precision == "fp16" else emulate_low_precision(out)), run(source)
    tolerance = pipeline.DEFAULT_TOLERANCES["float16" if precision == "fp16" else "bfloat16"]
    np.testing.assert_allclose(got, want, atol=tolerance.atol, rtol=tolerance.rtol)
    graph, _ = to_graph(source)
    plan = plan_precision(graph, Settings(precision=precision))  # type: ignore[arg-type]
    if kind != "no_float_io":
        reason = {i.node: i.reason for i in plan.islands}[node]
        assert reason.startswith(f"control flow ({graph_op(source, node)}): runs in float32 with its bodies whole")


def graph_op(source: onnx.ModelProto, name: str) -> str:
    return next(n.op_type for n in source.graph.node if n.name == name)


@pytest.mark.parametrize("kind", sorted(GRAPHS))
def test_outer_references_reach_nested_bodies_and_skip_locals(kind: str) -> None:
    graph, _ = to_graph(GRAPHS[kind][0]())
    node = next(n for n in graph.nodes if n.name == GRAPHS[kind][1])
    names = {t.name for t in outer_references(node)}
    assert "h" in names
    assert not names & {"acc", "cond", "i", "s", "r", "n", "scaled", "t", "e"}, names


def test_fp16_loop_reads_the_outer_value_through_one_float32_cast() -> None:
    out = convert(loop_reading_outer(), "fp16")
    loop = next(n for n in out.graph.node if n.op_type == "Loop")
    step = next(a.g for a in loop.attribute if a.name == "body")
    read = next(n for n in step.node if n.name == "scale").input[1]
    producer = next(n for n in out.graph.node if read in n.output)
    assert producer.op_type == "Cast" and producer.attribute[0].i == T.FLOAT and producer.input[0] == "h"


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
# not loop_in_if: TensorRT-RTX 1.7 fails on a Loop inside an If even in float32 (graphScope.cpp:463, "Assertion
# mScopedOp2Scopes.contains(childScopedOp) failed"), with or without this pass
@pytest.mark.parametrize("kind", ["loop", "if", "nested", "scan"])
def test_tensorrt_rtx_builds_the_converted_control_flow(kind: str, precision: str) -> None:
    error = rtx_build_error(convert(GRAPHS[kind][0](), precision))
    assert error is None, error


@pytest.mark.parametrize("kind", ["if", "nested"])
def test_low_graph_inputs_read_by_a_body_are_cast_back_to_float32(kind: str) -> None:
    """With ``precision_io="low"`` the graph input ``x`` itself turns float16, and the bodies read it by name."""
    source = GRAPHS[kind][0]()
    graph, metadata = to_graph(source)
    ConvertPrecision()(graph, Settings(precision="fp16", precision_io="low"))
    out = to_model(graph, source, metadata)
    onnx.checker.check_model(out, full_check=True)
    assert out.graph.input[0].type.tensor_type.elem_type == T.FLOAT16
    inside = body_values(out, "Loop") | body_values(out, "If")
    assert float_types(out, inside) == {T.FLOAT}
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": FEED["x"].astype(np.float16)})[0].astype(np.float32)
    tolerance = pipeline.DEFAULT_TOLERANCES["float16"]
    np.testing.assert_allclose(got, run(source), atol=tolerance.atol, rtol=tolerance.rtol)
