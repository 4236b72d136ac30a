"""Pattern rules (passes.patterns, one kind of passes.rules.RewriteRule): constraints, commutative inputs, several
outputs, checks with reasons, trace mode."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from converters.context import ConverterContext
from converters.settings import Settings
from passes.patterns import Bindings, Const, Op, Rule, Var
from passes.rules import RulePass

F32 = np.float32


def finish(nodes: list[gs.Node], inputs: list[gs.Variable], outputs: list[gs.Variable]) -> gs.Graph:
    graph = gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs, opset=20)
    graph.ir_version = 10
    return graph


def run(graph: gs.Graph, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    model = gs.export_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def var(name: str, shape: tuple[int, ...] = (2, 3)) -> gs.Variable:
    return gs.Variable(name, dtype=F32, shape=shape)


DIV_BY_CONST = Rule(
    "div_by_const",
    Op("Div", Var("x"), Const("c", lambda v: bool(np.all(v != 0)))),
    lambda b, ctx: ctx.op.Mul(b["x"], ctx.constant((1.0 / b.constants["c"]).astype(F32), "reciprocal")),
)


def div_graph(divisor: np.ndarray) -> gs.Graph:
    x, y = var("x"), var("y")
    return finish([gs.Node("Div", "div", inputs=[x, gs.Constant("c", divisor)], outputs=[y])], [x], [y])


def test_constant_value_constraint_and_rewrite_numbers() -> None:
    graph = div_graph(np.full((2, 3), 4.0, F32))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(F32)
    before = run(graph.copy(), {"x": x})
    result = RulePass("rules", (DIV_BY_CONST,), repeat=True)(graph, Settings())
    assert result.modified and [n.op for n in result.graph.nodes] == ["Mul"]
    assert result.graph.nodes[0].name == "div/Mul"  # named after the node it replaced
    np.testing.assert_allclose(run(result.graph, {"x": x})[0], before[0], rtol=1e-6)


def test_check_explains_a_failed_constraint() -> None:
    graph = div_graph(np.array([[1, 0, 2]] * 2, F32))
    assert not RulePass("rules", (DIV_BY_CONST,), repeat=True)(graph, Settings()).modified
    assert DIV_BY_CONST.explain(graph, "div") == (
        "rule 'div_by_const' does not match 'div': input 1 of 'div': constant 'c' fails the value constraint of 'c'"
    )
    x, y, z = var("x"), var("y"), var("z")
    dynamic = finish([gs.Node("Div", "div", inputs=[x, z], outputs=[y])], [x, z], [y])
    assert DIV_BY_CONST.explain(dynamic, "div").endswith("input 1 of 'div' ('z') is not a constant")


# x * sigmoid(x), either input order, with the same x on both sides -> one Swish-free form: x / (1 + exp(-x))
SILU = Rule(
    "silu",
    Op("Mul", Var("x"), Op("Sigmoid", Var("x")), commutative=True),
    lambda b, ctx: ctx.op.Div(b["x"], ctx.op.Add(ctx.op.Exp(ctx.op.Neg(b["x"])), np.float32(1.0))),
)


def silu_graph(sigmoid_first: bool, same_x: bool = True) -> gs.Graph:
    x, other, s, y = var("x"), var("other"), var("s"), var("y")
    sig = gs.Node("Sigmoid", "sig", inputs=[x if same_x else other], outputs=[s])
    mul = gs.Node("Mul", "mul", inputs=[s, x] if sigmoid_first else [x, s], outputs=[y])
    return finish([sig, mul], [x, other], [y])


def test_commutative_inputs_match_either_order() -> None:
    for sigmoid_first in (False, True):
        graph = silu_graph(sigmoid_first)
        x = np.linspace(-5, 5, 6, dtype=F32).reshape(2, 3)
        feed = {"x": x, "other": x}
        before = run(graph.copy(), feed)[0]
        result = RulePass("rules", (SILU,), repeat=True)(graph, Settings())
        assert result.modified and "Sigmoid" not in [n.op for n in result.graph.nodes]
        np.testing.assert_allclose(run(result.graph, feed)[0], before, rtol=2e-5, atol=1e-6)  # same math, other ulps


def test_a_name_bound_twice_must_be_the_same_tensor() -> None:
    graph = silu_graph(False, same_x=False)
    assert not RulePass("rules", (SILU,), repeat=True)(graph, Settings()).modified
    assert "'x' is already bound to 'x', not 'other'" in SILU.explain(graph, "mul")


def test_inner_node_with_other_consumers_is_not_rewritten() -> None:
    graph = silu_graph(False)
    extra = var("extra")
    graph.nodes.append(gs.Node("Relu", "relu", inputs=[graph.nodes[0].outputs[0]], outputs=[extra]))
    graph.outputs.append(extra)
    assert not RulePass("rules", (SILU,), repeat=True)(graph, Settings()).modified
    assert "has other consumers" in SILU.explain(graph, "mul")


def split_to_slices(b: Bindings, ctx: ConverterContext) -> list[gs.Tensor]:
    sizes = b.constants["sizes"].tolist()
    starts = np.cumsum([0, *sizes[:-1]])
    axis = np.array([b["split"].attrs.get("axis", 0)], np.int64)
    return [
        ctx.op.Slice(b["x"], np.array([s], np.int64), np.array([s + n], np.int64), axis)
        for s, n in zip(starts, sizes, strict=True)
    ]


def test_several_outputs_and_attribute_constraint() -> None:
    rule = Rule(
        "split_to_slices",
        Op("Split", Var("x"), Const("sizes"), attrs={"axis": 1}, name="split", outputs=2),
        split_to_slices,
        check=lambda b, g: None if b["x"].shape is not None else "needs a static input shape",
    )
    graph = split_graph(axis=1)
    feed = {"x": np.arange(10, dtype=F32).reshape(2, 5)}
    before = run(graph.copy(), feed)
    result = RulePass("rules", (rule,), repeat=True)(graph, Settings())
    assert [n.op for n in result.graph.nodes] == ["Slice", "Slice"]
    assert [t.name for t in result.graph.outputs] == ["part0", "part1"]  # graph outputs keep their names
    for got, want in zip(run(result.graph, feed), before, strict=True):
        np.testing.assert_array_equal(got, want)
    assert "attribute axis of 'split' is 0, the pattern wants 1" in rule.explain(split_graph(axis=0), "split")
    unknown = split_graph(axis=1, shape=None)
    assert "check rejected it: needs a static input shape" in rule.explain(unknown, "split")


def split_graph(axis: int, sizes: tuple[int, ...] = (2, 3), shape: tuple[int, ...] | None = (2, 5)) -> gs.Graph:
    x = gs.Variable("x", dtype=F32, shape=shape)
    outs = [gs.Variable(f"part{i}", F32, (2, n)) for i, n in enumerate(sizes)]
    split = gs.Node(
        "Split",
        "split",
        attrs={"axis": axis},
        inputs=[x, gs.Constant("sizes", np.array(sizes, np.int64))],
        outputs=outs,
    )
    return finish([split], [x], outs)


def test_rules_apply_in_deterministic_order() -> None:
    first = Rule("to_neg", Op("Relu", Var("x")), lambda b, ctx: ctx.op.Neg(b["x"]))
    second = Rule("to_abs", Op("Relu", Var("x")), lambda b, ctx: ctx.op.Abs(b["x"]))
    for _ in range(3):
        x, y = var("x"), var("y")
        graph = finish([gs.Node("Relu", "relu", inputs=[x], outputs=[y])], [x], [y])
        result = RulePass("rules", (first, second), repeat=True)(graph, Settings())
        assert [n.op for n in result.graph.nodes] == ["Neg"]
