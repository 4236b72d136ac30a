"""The one rewrite API (passes.rules): a user rule written as built-in ones are, run by convert, explained per node;
a pass runs a tuple of rules; parser fixes' reasons reach the check report."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from test_parser_fixes_support import parse

import passes
import pipeline
from converters.errors import ConversionError
from converters.settings import Settings
from passes.parser_fixes import parser_fix_passes
from passes.patterns import Op, Rule, Var
from passes.rules import Facts, RewriteContext, RewriteRule, RulePass, explain


class DivByConstant(RewriteRule[np.ndarray]):
    """``x / c`` -> ``x * (1 / c)`` for a float constant ``c`` without zeros."""

    name = "div_by_constant"
    ops = frozenset({"Div"})

    def check(self, node: gs.Node, facts: Facts) -> np.ndarray | str:
        divisor = node.inputs[1]
        if not isinstance(divisor, gs.Constant):
            return f"the divisor {divisor.name!r} is not a constant"
        values = np.asarray(divisor.values)
        if values.dtype.kind != "f" or not np.all(values != 0):
            return "the divisor is not a float constant without zeros"
        return (1 / values).astype(values.dtype)

    def rewrite(self, plan: np.ndarray, ctx: RewriteContext) -> gs.Tensor:
        return ctx.op.Mul(ctx.node.inputs[0], ctx.constant(plan, "reciprocal"))


class Halve(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x) / 2.0, x / y


def test_user_rule_in_the_pass_list_of_convert_matches_pytorch() -> None:
    model, sample = Halve().eval(), (torch.randn(2, 4), torch.rand(2, 4) + 0.5)
    rules = RulePass("my_rules", (DivByConstant(),))
    module = pipeline.convert(model, sample, passes=(*passes.default_passes(), rules))
    ops = [n.op_type for n in module.onnx.graph.node]
    assert ops.count("Div") == 1 and "Mul" in ops  # x / y stays: y is no constant
    assert "my_rules" in [r.name for r in module.report.passes]
    mul = next(n for n in module.onnx.graph.node if n.op_type == "Mul")
    assert "/" in mul.name  # named after the Div it replaced
    for got, want in zip(module(*sample), model(*sample), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def div_graph(divisor: gs.Tensor) -> gs.Graph:
    x, y, z = (gs.Variable(n, dtype=np.float32, shape=(2, 3)) for n in ("x", "y", "z"))
    nodes = [gs.Node("Div", "div", inputs=[x, divisor], outputs=[y]), gs.Node("Relu", "relu", inputs=[y], outputs=[z])]
    inputs = [x] + ([divisor] if isinstance(divisor, gs.Variable) else [])
    return gs.Graph(nodes=nodes, inputs=inputs, outputs=[z], opset=20)


def test_explain_answers_for_a_rule_and_for_each_rule_of_a_pass() -> None:
    graph = div_graph(gs.Variable("d", dtype=np.float32, shape=(2, 3)))
    rule = DivByConstant()
    assert (
        explain(rule, graph, "div") == "rule 'div_by_constant' does not match 'div': the divisor 'd' is not a constant"
    )
    assert "the rule looks at Div" in explain(rule, graph, "relu")
    assert explain(rule, graph, "nope") == "no node named 'nope'"
    div_to_abs = Rule("div_to_abs", Op("Div", Var("a"), Var("b")), lambda b, ctx: ctx.op.Abs(b["a"]))
    both = RulePass("two", (rule, div_to_abs))
    assert explain(both, graph, "div").splitlines() == [
        "pass 'two' on Div node 'div':",
        "  rule 'div_by_constant': the divisor 'd' is not a constant",
        "  rule 'div_to_abs': would rewrite it",
    ]
    constant = div_graph(gs.Constant("c", np.full((2, 3), 4.0, np.float32)))
    assert explain(rule, constant, "div") == "rule 'div_by_constant' matches 'div'"
    with pytest.raises(ConversionError, match="not written as rules"):
        explain(passes.RemoveDeadNodes(), graph, "div")  # type: ignore[arg-type]


def test_a_rule_is_the_pass_that_runs_it_alone_and_names_what_it_builds_after_the_node() -> None:
    graph = div_graph(gs.Constant("c", np.full((2, 3), 4.0, np.float32)))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    result = DivByConstant()(graph, Settings())
    assert result.modified and [n.op for n in result.graph.nodes] == ["Mul", "Relu"]
    assert result.graph.nodes[0].name == "div/Mul" and result.graph.nodes[0].outputs[0].name == "y"
    model = gs.export_onnx(result.graph)
    onnx.checker.check_model(model, full_check=True)
    (got,) = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(got, np.maximum(x * 0.25, 0))
    assert not DivByConstant()(result.graph, Settings()).modified


def test_rules_are_an_explicit_tuple_and_a_rewrite_returns_one_tensor_per_output() -> None:
    with pytest.raises(ConversionError, match="tuple"):
        RulePass("listed", [DivByConstant()])  # type: ignore[arg-type]

    class TwoResults(DivByConstant):
        def rewrite(self, plan: np.ndarray, ctx: RewriteContext) -> list[gs.Tensor]:  # type: ignore[override]
            x = ctx.node.inputs[0]
            return [ctx.op.Mul(x, plan), ctx.op.Neg(x)]

    graph = div_graph(gs.Constant("c", np.full((2, 3), 4.0, np.float32)))
    with pytest.raises(ConversionError, match="rule 'div_by_constant' returned 2 value"):
        RulePass("two", (TwoResults(),))(graph, Settings())


def test_typed_builder_records_dtypes_of_intermediate_tensors() -> None:
    class SquareViaMul(RewriteRule[None]):
        name, ops = "square", frozenset({"Pow"})

        def check(self, node: gs.Node, facts: Facts) -> None | str:
            return None

        def rewrite(self, plan: None, ctx: RewriteContext) -> gs.Tensor:
            x = ctx.node.inputs[0]
            double = ctx.typed(np.float32).Add(x, x)
            return ctx.op.Mul(ctx.op.Mul(double, np.float32(0.5)), x)

    x, y = gs.Variable("x", dtype=np.float32, shape=(3,)), gs.Variable("y", dtype=np.float32, shape=(3,))
    pow_node = gs.Node("Pow", "pow", inputs=[x, gs.Constant("two", np.array(2, np.float32))], outputs=[y])
    graph = gs.Graph(nodes=[pow_node], inputs=[x], outputs=[y], opset=20)
    SquareViaMul()(graph, Settings())
    add, half, square = graph.nodes
    assert add.outputs[0].dtype == np.float32 and add.outputs[0].name == "pow/Add_out0"
    assert half.outputs[0].dtype is None  # ctx.op leaves the type to inference, as in a converter
    assert graph.outputs[0] is square.outputs[0] and square.outputs[0].name == "y" and square.name == "pow/Mul_1"
    value = np.array([-2.0, 0.5, 3.0], np.float32)
    (got,) = onnx.reference.ReferenceEvaluator(gs.export_onnx(graph)).run(None, {"x": value})
    np.testing.assert_array_equal(got, value**2)


def test_check_report_shows_why_each_parser_fix_declined_a_rejected_node() -> None:
    model = parse(
        '<ir_version: 10, opset_import: ["" : 20]>\n'
        "g (float[4] x, bool[4] c) => (float[N] y) { y = Compress<axis=0>(x, c) }"
    )
    model.graph.node[0].name = "pick"
    report = pipeline.check(model, trt_version="11.1")
    (problem,) = report.problems
    assert problem.node == "pick" and problem.status == "unsupported"
    assert problem.declined == ("parser fix 'compress_to_gather' declined: condition is not a 1-D constant",)
    assert "parser fix 'compress_to_gather' declined: condition is not a 1-D constant" in report.summary()
    assert report.to_dict()["problems"][0]["declined"] == problem.declined
    fix = next(f for f in parser_fix_passes() if f.name == "compress_to_gather")
    graph = gs.import_onnx(model)
    assert explain(fix, graph, "pick").endswith("condition is not a 1-D constant")


def test_check_report_shows_the_reduce_axes_fix_on_a_restricted_node() -> None:
    model = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2,3] x, int64[1] a) => (float[N] y) { y = ReduceSum<keepdims=0>(x, a) }"
    )
    model.graph.node[0].name = "sum"
    (problem,) = pipeline.check(model, trt_version="11.1").problems
    assert problem.status == "restriction violated"
    assert problem.declined == (
        "parser fix 'reduce_axes_to_initializers' declined: axes 'a' is not computable before running the graph "
        "(a dynamic shape or an input)",
    )
