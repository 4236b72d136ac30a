"""The linear-time folding, cleanup and sort give exactly what graph-surgeon's own do, on graphs made to hit their
corners: Constant node kinds, shape-cast elision, every kind of shape folding, an op ONNX Runtime cannot run, the size
threshold, graph-surgeon's quirks (an omitted output, a node named like a tensor), several sessions, unsorted input."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from passes import to_graph
from passes.cleanup.graph import remove_unused, toposort
from passes.folding import evaluation as fold_evaluation
from passes.folding.fold import fold_constants


def make(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: Sequence[onnx.TensorProto] = (),
    opset: int = 18,
    value_info: Sequence[onnx.ValueInfoProto] = (),
    domains: Sequence[str] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=list(value_info))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def vi(name: str, shape: list | None, elem: int = TP.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, value: object) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def node(op: str, inputs: list[str], outputs: list[str], name: str, **attrs: object) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=name, **attrs)


def chain(blocks: int, fail_at: int | None = None, duplicate_name: bool = False) -> onnx.ModelProto:
    """Per block: a foldable Mul -> Neg (or an op ONNX Runtime lacks) added to the running value."""
    nodes, previous = [], "x"
    for i in range(blocks):
        op, domain = ("Frob", "com.example") if i == fail_at else ("Neg", "")
        name = "twin" if duplicate_name and i in (1, blocks - 2) else f"mul{i}"
        nodes += [
            node("Mul", ["one", "one"], [f"k{i}"], name),
            node(op, [f"k{i}"], [f"n{i}"], f"neg{i}", domain=domain),
            node("Add", [previous, f"n{i}"], [f"y{i}"], f"add{i}"),
        ]
        previous = f"y{i}"
    domains = ["com.example"] if fail_at is not None else []
    return make(nodes, [vi("x", [2])], [vi(previous, [2])], [init("one", np.ones(2, np.float32))], domains=domains)


CASES = {
    "constant_nodes": make(
        [
            node("Constant", [], ["cf"], "cf", value_float=0.5),
            node("Constant", [], ["ci"], "ci", value_ints=[1, 2]),
            node("Constant", [], ["ct"], "ct", value=numpy_helper.from_array(np.ones((2,), np.float32))),
            node("Cast", ["ci"], ["cic"], "cic", to=TP.FLOAT),
            node("Add", ["ct", "cic"], ["s"], "add"),
            node("Mul", ["x", "s"], ["y0"], "mul"),
            node("Add", ["y0", "cf"], ["y"], "add2"),
        ],
        [vi("x", [2])],
        [vi("y", [2], TP.DOUBLE)],
    ),
    "shape_cast_elision": make(
        [
            node("Shape", ["x"], ["sh"], "shape"),
            node("Gather", ["sh", "zero"], ["n"], "gather", axis=0),
            node("Cast", ["n"], ["nf"], "cast_f", to=TP.FLOAT),
            node("Div", ["nf", "two"], ["h"], "div"),
            node("Cast", ["h"], ["hi"], "cast_i", to=TP.INT64),
            node("Unsqueeze", ["hi", "axes0"], ["hu"], "unsq"),
            node("Concat", ["hu", "minus1"], ["newshape"], "concat", axis=0),
            node("Reshape", ["x", "newshape"], ["y"], "reshape"),
        ],
        [vi("x", ["N", 4])],
        [vi("y", None)],
        [init("zero", np.int64(0)), init("two", np.float32(2)), init("axes0", [0]), init("minus1", [-1])],
        value_info=[vi("n", [], TP.INT64), vi("nf", [], TP.FLOAT), vi("h", [], TP.FLOAT), vi("hi", [], TP.INT64)],
    ),
    "shape_folding": make(
        [
            node("Shape", ["x"], ["sh"], "shape"),
            node("Gather", ["sh", "neg"], ["g1"], "g_neg", axis=0),
            node("Gather", ["sh", "vec"], ["g2"], "g_vec", axis=0),
            node("Slice", ["sh", "st", "en", "ax", "stp"], ["sl"], "slice"),
            node("Shape", ["d"], ["shd"], "shape_dynamic"),
            node("Gather", ["shd", "neg"], ["gd"], "g_dynamic", axis=0),
            node("Concat", ["g2", "sl", "gd"], ["c"], "concat", axis=0),
            node("Unsqueeze", ["g1", "ax"], ["g1u"], "unsq"),
            node("Concat", ["c", "g1u"], ["y"], "concat2", axis=0),
        ],
        [vi("x", [2, 3, 5, 7]), vi("d", [4, "D"])],
        [vi("y", [None], TP.INT64)],
        [init("neg", np.int64(-1)), init("vec", [0, 2]), init("st", [1]), init("en", [4]), init("ax", [0])]
        + [init("stp", [2])],
    ),
    "shape_folding_error_midway": make(  # the second Gather's index is out of range: graph-surgeon stops Gathers there
        [
            node("Shape", ["x"], ["sh"], "shape"),
            node("Gather", ["sh", "zero"], ["g0"], "g_ok", axis=0),
            node("Unsqueeze", ["g0", "ax"], ["u0"], "unsq"),
            node("Gather", ["sh", "five"], ["g5"], "g_bad", axis=0),
            node("Unsqueeze", ["g5", "ax"], ["u5"], "unsq5"),
            node("Concat", ["u0", "u5"], ["y"], "concat", axis=0),
        ],
        [vi("x", [2, "D"])],
        [vi("y", [2], TP.INT64)],
        [init("zero", np.int64(0)), init("five", np.int64(5)), init("ax", [0])],
    ),
    "slice_attributes_opset9": make(
        [
            node("Shape", ["x"], ["sh"], "shape"),
            node("Slice", ["sh"], ["sl"], "slice", starts=[1], ends=[3], axes=[0]),
            node("Cast", ["sl"], ["y"], "cast", to=TP.FLOAT),
        ],
        [vi("x", [2, 3, 5])],
        [vi("y", [2])],
        opset=9,
    ),
    "op_onnx_runtime_lacks": make(
        [
            node("Add", ["a", "a"], ["aa"], "aa"),
            node("Frob", ["aa"], ["fa"], "frob", domain="com.example"),
            node("Shape", ["x"], ["sh"], "shape"),
            node("Cast", ["sh"], ["shf"], "cast", to=TP.FLOAT),
            node("Add", ["x", "fa"], ["s"], "add"),
            node("Add", ["s", "shf"], ["y"], "add2"),
        ],
        [vi("x", [3])],
        [vi("y", [3])],
        [init("a", np.ones(3, np.float32))],
        domains=["com.example"],
    ),
    "size_threshold": make(
        [
            node("Expand", ["one", "big_shape"], ["big"], "expand"),
            node("ReduceSum", ["big", "ax0"], ["small"], "reduce", keepdims=0),
            node("Add", ["x", "small"], ["y"], "add"),
            node("Mul", ["x", "big"], ["z"], "mul"),
        ],
        [vi("x", [512])],
        [vi("y", [512]), vi("z", [1024, 512])],
        [init("one", np.ones(1, np.float32)), init("big_shape", [1024, 512]), init("ax0", [0])],
        value_info=[vi("big", [1024, 512]), vi("small", [512])],
    ),
    "omitted_output": make(
        [
            node("Split", ["c", "sp"], ["c0", "c1"], "split", axis=0),
            node("Add", ["x", "c0"], ["y"], "add"),
            node("TopK", ["c", "k"], ["tv", ""], "topk"),
            node("Add", ["y", "tv"], ["z"], "add2"),
        ],
        [vi("x", [2])],
        [vi("z", [2])],
        [init("c", np.arange(4, dtype=np.float32)), init("sp", [2, 2]), init("k", [2])],
    ),
    "node_named_like_a_tensor": make(
        [node("Mul", ["a", "a"], ["m"], "m0"), node("Neg", ["m"], ["n"], "m"), node("Add", ["x", "n"], ["y"], "add")],
        [vi("x", [3])],
        [vi("y", [3])],
        [init("a", np.full(3, 2.0, np.float32))],
    ),
    "quantize_dequantize": make(
        [
            node("QuantizeLinear", ["w", "sc", "zp"], ["wq"], "q"),
            node("DequantizeLinear", ["wq", "sc", "zp"], ["wd"], "dq"),
            node("Add", ["x", "wd"], ["y"], "add"),
        ],
        [vi("x", [3])],
        [vi("y", [3])],
        [init("w", np.ones(3, np.float32)), init("sc", np.float32(0.1)), init("zp", np.int8(0))],
    ),
    "several_sessions": chain(12),
    "several_sessions_one_failing": chain(12, fail_at=9),
    "several_sessions_duplicate_names": chain(12, duplicate_name=True),
}


def exported(graph: gs.Graph) -> bytes:
    return gs.export_onnx(graph, do_type_check=False).SerializeToString(deterministic=True)


def shuffled(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    result = onnx.ModelProto()
    result.CopyFrom(model)
    nodes = list(result.graph.node)
    random.Random(seed).shuffle(nodes)
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    return result


@pytest.fixture(autouse=True)
def small_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_evaluation, "SESSION_NODES", 4)  # the chains then need several ONNX Runtime sessions


@pytest.mark.parametrize("seed", [None, 0, 1])
@pytest.mark.parametrize("threshold", [4 << 20, 2048, 64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fold_matches_graph_surgeon(case: str, threshold: int, seed: int | None) -> None:
    model = CASES[case] if seed is None else shuffled(CASES[case], seed)
    reference, _ = to_graph(model)
    reference.ir_version = 10
    reference.fold_constants(fold_shapes=True, size_threshold=threshold, error_ok=True)
    reference.cleanup(remove_unused_graph_inputs=False)
    graph, _ = to_graph(model)
    graph.ir_version = 10
    assert fold_constants(graph, threshold)
    remove_unused(graph)
    assert exported(graph) == exported(reference)
    assert [(o.domain, o.version) for o in graph.import_domains] == [
        (o.domain, o.version) for o in reference.import_domains
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_cleanup_and_sort_match_graph_surgeon(case: str) -> None:
    model = shuffled(CASES[case], 0)
    reference, _ = to_graph(model)
    graph, _ = to_graph(model)
    reference.cleanup(remove_unused_graph_inputs=False)
    remove_unused(graph)
    assert exported(graph) == exported(reference)
    consumers = {name: [n.name for n in t.outputs] for name, t in graph.tensors().items()}
    assert consumers == {name: [n.name for n in t.outputs] for name, t in reference.tensors().items()}
    reference.toposort()
    toposort(graph)
    assert exported(graph) == exported(reference)


def test_graphs_with_subgraphs_go_to_graph_surgeon() -> None:
    then_graph = helper.make_graph([node("Neg", ["a"], ["t"], "neg")], "then", [], [vi("t", [2])])
    else_graph = helper.make_graph([node("Abs", ["a"], ["e"], "abs")], "else", [], [vi("e", [2])])
    model = make(
        [node("If", ["cond"], ["r"], "if", then_branch=then_graph, else_branch=else_graph)],
        [vi("x", [2])],
        [vi("r", [2])],
        [init("cond", np.array(True)), init("a", np.ones(2, np.float32))],
    )
    graph, _ = to_graph(model)
    assert not fold_constants(graph, 1 << 20)
