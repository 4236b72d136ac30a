"""Reduce axes moved into initializers, and what every parser-fix pass shares: its place in the default list,
naming after the replaced node, modified=False when there is nothing to do, and the default list end to end."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, ops, parse

import pipeline
from converters.settings import Settings
from passes import PassManager, default_passes
from passes.parser_fixes import ReduceAxesToInitializers, parser_fix_passes
from passes.parser_fixes.values import ValueResolver
from passes.rules import Facts

REDUCE_OPS = [
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare",
]  # fmt: skip


def test_every_reduce_op_gets_constant_node_axes_as_an_initializer() -> None:
    lines = ["axes = Constant<value = int64[2] {0, -1}>()"]
    outputs = []
    for op in REDUCE_OPS:
        lines.append(f"{op.lower()} = {op}<keepdims=0>(x, axes)")
        outputs.append(f"float[3] {op.lower()}")
    model = parse(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        f"g (float[2,3,4] x) => ({', '.join(outputs)}) {{ {' '.join(lines)} }}"
    )
    for node, op in zip(model.graph.node[1:], REDUCE_OPS, strict=True):
        node.name = op
    after, result = apply(ReduceAxesToInitializers(), model)
    assert result.modified and ops(after) == REDUCE_OPS
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in after.graph.initializer}
    for node in after.graph.node:
        assert node.input[1] == f"{node.name}/axes"
        np.testing.assert_array_equal(initializers[node.input[1]], [0, -1])
    x = np.abs(np.random.default_rng(0).standard_normal((2, 3, 4))).astype(np.float32) + 0.5  # logs defined
    assert_same_outputs(model, after, {"x": x}, rtol=1e-6)


def test_reduce_sum_axes_from_shape_arithmetic_on_static_shapes() -> None:
    """Opset 13 ReduceSum reads axes as an input; here they are ``[rank - 1]`` computed from Shape."""
    model = parse(
        '<ir_version: 10, opset_import: ["" : 13]>\n'
        "g (float[2,3,4] x) => (float[2,3,1] y) <int64 one = {1}, int64[1] zero = {0}> {\n"
        "  shape = Shape(x)  rank = Size(shape)  last = Sub(rank, one)  axes = Unsqueeze(last, zero)\n"
        "  y = ReduceSum<keepdims=1>(x, axes)\n}"
    )
    after, _ = apply(ReduceAxesToInitializers(), model)
    assert ops(after) == ["ReduceSum"]
    assert onnx.numpy_helper.to_array(after.graph.initializer[0]).tolist() == [2]
    assert_same_outputs(model, after, {"x": np.arange(24, dtype=np.float32).reshape(2, 3, 4)})


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("axes a graph input", "g (float[2,3] x, int64[1] a) => (float[N] y) { y = ReduceMax<keepdims=0>(x, a) }"),
        ("axes from a dynamic shape", "g (float[N,3] x) => (float[M] y) <int64[1] i = {0}> "
         "{ s = Shape(x) a = Gather(s, i) y = ReduceMax<keepdims=0>(x, a) }"),
        ("already an initializer", "g (float[2,3] x) => (float[2] y) <int64[1] a = {1}> "
         "{ y = ReduceMean<keepdims=0>(x, a) }"),
        ("no axes input", "g (float[2,3] x) => (float y) { y = ReduceMean<keepdims=0>(x) }"),
    ],
)  # fmt: skip
def test_reduce_axes_left_unchanged(case: str, text: str) -> None:
    model = onnx.parser.parse_model(f'<ir_version: 10, opset_import: ["" : 18]>\n{text}')
    assert_unchanged(ReduceAxesToInitializers(), model)
    graph = gs.import_onnx(model)
    reduce = next(n for n in graph.nodes if n.op.startswith("Reduce"))
    assert isinstance(ReduceAxesToInitializers().check(reduce, Facts(graph)), str)


def test_value_resolver_stops_at_large_constants() -> None:
    big = gs.Constant("big", np.zeros(1 << 17, np.int64))
    assert ValueResolver(18).resolve(big) is None
    assert ValueResolver(18).resolve(gs.Constant("small", np.arange(3))).tolist() == [0, 1, 2]


def test_parser_fixes_sit_between_folding_and_toposort_in_the_default_list() -> None:
    names = [p.name for p in default_passes()]
    fixes = [p.name for p in parser_fix_passes()]
    start = names.index(fixes[0])
    assert names[start : start + len(fixes)] == fixes
    assert names.index("fold_constants") < start and names[-1] == "toposort"
    assert len(set(fixes)) == len(fixes) == 21


def test_no_pass_modifies_a_graph_without_its_ops() -> None:
    model = parse(
        '<ir_version: 10, opset_import: ["" : 20]>\n'
        "g (float[2,3] x) => (float[2] y) <int64[1] a = {1}> { r = Relu(x) y = ReduceSum<keepdims=0>(r, a) }"
    )
    for graph_pass in parser_fix_passes():
        assert_unchanged(graph_pass, model)


def test_nameless_node_lends_its_output_name() -> None:
    model = parse(
        '<ir_version: 10, opset_import: ["" : 20]>\n'
        "g (float[4] x) => (float[2] picked) <bool[4] c = {0,1,0,1}> { picked = Compress<axis=0>(x, c) }"
    )
    after, _ = apply(next(p for p in parser_fix_passes() if p.name == "compress_to_gather"), model)
    assert [n.name for n in after.graph.node] == ["picked/Gather"]
    assert [o.name for o in after.graph.output] == ["picked"]


def test_default_list_leaves_nothing_the_parser_check_rejects() -> None:
    """A graph the exporter could have written: constants as Constant nodes, rejected ops fed by them."""
    model = parse(
        '<ir_version: 10, opset_import: ["" : 20]>\n'
        "g (float[2,16] x, int64[2,4] k) => (float[2,9] spectrum, float[2] kept, int64[2,4] masked) {\n"
        "  last = Constant<value = int64[1] {-1}>()  one = Constant<value = int64 {1}>()\n"
        "  every_other = Constant<value = bool[16] {1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0}>()\n"
        "  columns = Constant<value = int64[1] {1}>()  low_cleared = Constant<value = int64 {-8}>()\n"
        "  u = Unsqueeze(x, last)  z = DFT<onesided=1>(u, , one)  spectrum = ReduceL2<keepdims=0>(z, last)\n"
        "  picked = Compress<axis=1>(x, every_other)  kept = ReduceMean<keepdims=0>(picked, columns)\n"
        "  masked = BitwiseAnd(k, low_cleared)\n}"
    )  # fmt: skip
    graph, records = PassManager(default_passes(), max_iterations=4).run(gs.import_onnx(model), Settings())
    after = gs.export_onnx(graph)
    after.ir_version = 10
    onnx.checker.check_model(after, full_check=True)
    assert pipeline.check(after, trt_version="11.1").ok, pipeline.check(after, trt_version="11.1").summary()
    assert {r.name for r in records if r.modified} >= {"dft_to_matmul", "compress_to_gather", "bitwise_to_arithmetic"}
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    k = np.array([[-9, -8, -1, 0], [7, 8, 2**40 + 3, -(2**40) - 3]], np.int64)
    assert_same_outputs(model, after, {"x": x, "k": k}, rtol=1e-5, atol=1e-5)
