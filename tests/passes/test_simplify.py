"""RemoveIdentityElements, MergeScaleChains and MergeSqueezeChains: what they rewrite, what they must leave, and
the same numbers."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import onnx_model

from converters.settings import Settings
from passes import PassManager, default_passes
from passes.base import GraphPass
from passes.cleanup.simplify import (
    MergeScaleChains,
    MergeSqueezeChains,
    RemoveIdentityElements,
    merged_squeeze_axes,
    merged_unsqueeze_axes,
)
from passes.rules import Facts

Shape = Sequence[int | str] | None


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, Shape]],
    outputs: list[tuple[str, int, Shape]],
    constants: dict[str, np.ndarray] | None = None,
    opset: int = 18,
    value_info: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    model = onnx_model(nodes, inputs, outputs, constants, opset)
    # graph outputs need shapes (the checker says so); inner tensors keep none, so a pass sees only the inputs'
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.value_info[:]
    model.graph.value_info.extend(value_info)
    return model


def run_pass(graph_pass: GraphPass, model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    result = graph_pass(gs.import_onnx(model), Settings())
    after = gs.export_onnx(result.graph)
    after.ir_version = model.ir_version
    onnx.checker.check_model(after, full_check=True)
    return after, result.modified


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def feed_for(model: onnx.ModelProto, sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs; a symbolic dim takes its size from ``sizes`` (3 if not given), an unknown-rank input is 2x3."""
    rng = np.random.default_rng(0)
    feed = {}
    for value in model.graph.input:
        tensor_type = value.type.tensor_type
        if tensor_type.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (sizes or {}).get(d.dim_param, 3) for d in
                     tensor_type.shape.dim]  # fmt: skip
        else:
            shape = [2, 3]
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        array = rng.standard_normal(shape) * 10
        # negative zeros too: x * 1, x / 1 and x - 0 must keep them as they are
        array.reshape(-1)[:1] = -0.0
        feed[value.name] = array.astype(dtype)
    return feed


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, feed)]


def assert_same_numbers(before: onnx.ModelProto, after: onnx.ModelProto, sizes: dict[str, int] | None = None) -> None:
    feed = feed_for(before, sizes)
    for want, got in zip(run(before, feed), run(after, feed), strict=True):
        assert want.shape == got.shape and want.dtype == got.dtype
        np.testing.assert_array_equal(got, want)


# -- identity elements -----------------------------------------------------------------------------------------------


def binary_then_abs(
    op: str,
    constant: np.ndarray,
    *,
    constant_first: bool = False,
    shape: Shape = (2, 3),
    dtype: int = TensorProto.FLOAT,
    neg_dtype: int | None = TensorProto.FLOAT,
) -> onnx.ModelProto:
    """x -> op(x, c) (or op(c, x)) -> Abs -> y: the op's output is not a graph output. ``shape=None``: x is [2, 3]
    but the op reads Neg(x), whose shape the graph does not record (nor its dtype, if ``neg_dtype`` is None)."""
    operand = "x" if shape is not None else "neg"
    inputs = ["c", operand] if constant_first else [operand, "c"]
    nodes = [helper.make_node(op, inputs, ["t"], name=op), helper.make_node("Abs", ["t"], ["y"], name="abs")]
    if shape is None:
        nodes.insert(0, helper.make_node("Neg", ["x"], ["neg"], name="neg"))
    value_info = [helper.make_tensor_value_info("neg", neg_dtype, None)] if shape is None and neg_dtype else []
    return make_model(nodes, [("x", dtype, shape or (2, 3))], [("y", dtype, None)], {"c": constant}, 18, value_info)


def test_zero_attention_mask_add_is_bypassed() -> None:
    """The ViT case: scores [1, 3, 4, 4] + an all-zero mask [1, 1, 4, 4], then Softmax."""
    nodes = [
        helper.make_node("Add", ["scores", "mask"], ["masked"], name="add_mask"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
    ]
    model = make_model(
        nodes,
        [("scores", TensorProto.FLOAT, (1, 3, 4, 4))],
        [("probs", TensorProto.FLOAT, (1, 3, 4, 4))],
        {"mask": np.zeros((1, 1, 4, 4), np.float32)},
    )
    after, modified = run_pass(RemoveIdentityElements(), model)
    assert modified and ops(after) == ["Softmax"]
    assert after.graph.node[0].input[0] == "scores"
    assert not after.graph.initializer  # the mask went with the Add
    assert_same_numbers(model, after)


@pytest.mark.parametrize(
    ("op", "constant", "constant_first", "dtype"),
    [
        ("Add", np.zeros((1, 3), np.float32), False, TensorProto.FLOAT),
        ("Add", np.zeros((), np.float32), True, TensorProto.FLOAT),
        ("Add", np.array([0, 0, 0], np.int64), True, TensorProto.INT64),
        ("Sub", np.zeros((2, 1), np.float32), False, TensorProto.FLOAT),
        ("Mul", np.ones((3,), np.float32), False, TensorProto.FLOAT),
        ("Mul", np.ones((1, 1), np.float32), True, TensorProto.FLOAT),
        ("Div", np.ones((2, 3), np.float32), False, TensorProto.FLOAT),
        ("Div", np.ones((), np.int32), False, TensorProto.INT32),
    ],
)
def test_identity_element_is_bypassed(op: str, constant: np.ndarray, constant_first: bool, dtype: int) -> None:
    model = binary_then_abs(op, constant, constant_first=constant_first, dtype=dtype)
    after, modified = run_pass(RemoveIdentityElements(), model)
    assert modified and ops(after) == ["Abs"]
    assert after.graph.node[0].input[0] == "x"
    assert_same_numbers(model, after)


@pytest.mark.parametrize(
    ("op", "constant", "constant_first", "shape", "reason"),
    [
        ("Sub", np.zeros((), np.float32), True, (2, 3), "input 1: not a constant"),  # 0 - x is -x
        ("Div", np.ones((), np.float32), True, (2, 3), "input 1: not a constant"),  # 1 / x
        ("Add", np.zeros((2, 2, 3), np.float32), False, (2, 3), "raises the rank"),
        ("Add", np.zeros((1, 2, 3), np.float32), False, (2, 3), "raises the rank"),
        ("Add", np.zeros((4, 3), np.float32), False, (1, 3), "constant dim 4 against dim 1"),
        ("Mul", np.ones((3,), np.float32), False, ("n", "m"), "against dim 'm'"),  # m may be 1 at run time
        ("Add", np.zeros((1,), np.float32), False, None, "unknown rank"),  # (1,) may raise it
        ("Add", np.array([0.0, 0.5, 0.0], np.float32), False, (2, 3), "not all 0"),
        ("Add", np.array([0.5, 0.0, 0.0], np.float32), False, (2, 3), "not all 0"),
        ("Mul", np.array([1.0, 1.0, np.nan], np.float32), False, (2, 3), "not all 1"),
        ("Mul", np.zeros((), np.float32), False, (2, 3), "not all 1"),  # zero is not Mul's identity
        ("Add", np.ones((), np.float32), False, (2, 3), "not all 0"),  # nor one Add's
        ("Add", np.zeros((0,), np.float32), False, (2, 0), "not all 0"),  # empty: nothing to prove it by
    ],
)
def test_not_an_exact_identity_is_left(
    op: str, constant: np.ndarray, constant_first: bool, shape: Shape, reason: str
) -> None:
    model = binary_then_abs(op, constant, constant_first=constant_first, shape=shape)
    after, modified = run_pass(RemoveIdentityElements(), model)
    assert not modified and ops(after) == ([] if shape else ["Neg"]) + [op, "Abs"]
    graph = gs.import_onnx(model)
    node = next(n for n in graph.nodes if n.op == op)
    assert reason in str(RemoveIdentityElements().check(node, Facts(graph)))
    assert_same_numbers(model, after, {"n": 2, "m": 1})


@pytest.mark.parametrize(
    ("op", "constant", "shape"),
    [
        ("Add", np.zeros((1, 4), np.float32), ("n", 4)),  # a dim of 1 against a symbolic dim
        ("Mul", np.ones((4,), np.float32), ("n", 4)),
        ("Add", np.zeros((), np.float32), None),  # a scalar broadcasts within any shape, known or not
    ],
)
def test_symbolic_and_unknown_shapes_that_cannot_grow_are_bypassed(op: str, constant: np.ndarray, shape: Shape) -> None:
    model = binary_then_abs(op, constant, shape=shape)
    after, modified = run_pass(RemoveIdentityElements(), model)
    assert modified and ops(after) == ([] if shape else ["Neg"]) + ["Abs"]
    assert_same_numbers(model, after, {"n": 2})


def test_zero_of_another_dtype_is_left() -> None:
    """Invalid ONNX (Add takes one type), so graph-surgeon is given it directly: the pass must not trust the zero."""
    x = gs.Variable("x", dtype=np.float32, shape=(2, 3))
    t, y = gs.Variable("t", dtype=np.float32, shape=(2, 3)), gs.Variable("y", dtype=np.float32, shape=(2, 3))
    zero = gs.Constant("zero", np.zeros((3,), np.float64))
    nodes = [gs.Node("Add", "add", inputs=[x, zero], outputs=[t]), gs.Node("Abs", "abs", inputs=[t], outputs=[y])]
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=18)
    pass_ = RemoveIdentityElements()
    result = pass_(graph, Settings())
    assert not result.modified and [n.op for n in result.graph.nodes] == ["Add", "Abs"]
    assert "float64" in str(pass_.check(graph.nodes[0], Facts(graph)))


def test_operand_of_unknown_dtype_is_left() -> None:
    model = binary_then_abs("Add", np.zeros((), np.float32), shape=None, neg_dtype=None)
    after, modified = run_pass(RemoveIdentityElements(), model)
    assert not modified and ops(after) == ["Neg", "Add", "Abs"]
    graph = gs.import_onnx(model)
    reason = RemoveIdentityElements().check(graph.nodes[1], Facts(graph))
    assert "unknown dtype" in str(reason)


def test_graph_output_node_is_left() -> None:
    nodes = [helper.make_node("Add", ["x", "zero"], ["y"], name="add")]
    model = make_model(
        nodes, [("x", TensorProto.FLOAT, (2, 3))], [("y", TensorProto.FLOAT, (2, 3))], {"zero": np.zeros(3, np.float32)}
    )
    after, modified = run_pass(RemoveIdentityElements(), model)
    assert not modified and ops(after) == ["Add"] and after.graph.output[0].name == "y"


def test_chain_and_shared_constant_all_go_in_one_run_and_the_second_run_changes_nothing() -> None:
    nodes = [
        helper.make_node("Add", ["x", "zero"], ["a"], name="add"),
        helper.make_node("Mul", ["one", "a"], ["b"], name="mul"),
        helper.make_node("Add", ["b", "zero"], ["c"], name="add2"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
        helper.make_node("Add", ["x", "zero"], ["z"], name="add3"),  # the graph output keeps its Add
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, (2, 3))],
        [("y", TensorProto.FLOAT, (2, 3)), ("z", TensorProto.FLOAT, (2, 3))],
        {"zero": np.zeros((3,), np.float32), "one": np.ones((2, 1), np.float32)},
    )
    after, modified = run_pass(RemoveIdentityElements(), model)
    assert modified and ops(after) == ["Relu", "Add"]
    assert [o.name for o in after.graph.output] == ["y", "z"]
    assert_same_numbers(model, after)
    again, modified = run_pass(RemoveIdentityElements(), after)
    assert not modified and ops(again) == ops(after)


def test_check_says_why() -> None:
    model = binary_then_abs("Sub", np.zeros((), np.float32), constant_first=True)
    graph = gs.import_onnx(model)
    reason = RemoveIdentityElements().check(graph.nodes[0], Facts(graph))
    assert isinstance(reason, str) and "input 1: not a constant" in reason


# -- Unsqueeze and Squeeze chains ------------------------------------------------------------------------------------


def chain_model(
    op: str,
    shape: Shape,
    axes: list[list[int]],
    *,
    extra_reader: bool = False,
    inner_is_output: bool = False,
    opset: int = 18,
) -> onnx.ModelProto:
    """x -> op(axes[0]) -> op(axes[1]) -> ... -> y; ``extra_reader`` adds an Abs of the first op's output."""
    nodes, constants, source = [], {}, "x"
    if shape is None:  # x is [2, 3], the chain reads Neg(x), whose shape the graph does not record
        nodes.append(helper.make_node("Neg", ["x"], ["neg"], name="neg"))
        source = "neg"
    for i, node_axes in enumerate(axes):
        out = "y" if i == len(axes) - 1 else f"t{i}"
        if opset >= 13:
            constants[f"axes{i}"] = np.array(node_axes, np.int64)
            nodes.append(helper.make_node(op, [source, f"axes{i}"], [out], name=f"{op}{i}"))
        else:
            nodes.append(helper.make_node(op, [source], [out], name=f"{op}{i}", axes=node_axes))
        source = out
    outputs: list[tuple[str, int, Shape]] = [("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Abs", ["t0"], ["side"], name="abs"))
        outputs.append(("side", TensorProto.FLOAT, None))
    if inner_is_output:
        outputs.append(("t0", TensorProto.FLOAT, None))
    return make_model(nodes, [("x", TensorProto.FLOAT, shape or (2, 3))], outputs, constants, opset)


def merged_axes(model: onnx.ModelProto) -> list[int]:
    (node,) = [n for n in model.graph.node if n.op_type in ("Unsqueeze", "Squeeze")]  # exactly one left
    for attribute in node.attribute:
        if attribute.name == "axes":
            return list(attribute.ints)
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return initializers[node.input[1]].tolist()


@pytest.mark.parametrize(
    ("shape", "first", "second", "want"),
    [
        (("seq",), [1, 2], [3], [1, 2, 3]),  # BERT's arange -> [seq, 1, 1] -> [seq, 1, 1, 1]
        ((2, 3), [0], [-1], [0, 3]),
        ((2, 3), [-1], [0, -1], [0, 3, 4]),
        ((2, 3), [1], [1], [1, 2]),
        ((5,), [-1, 0], [2], [0, 2, 3]),
        ((2, 3), [-3], [-2], [0, 2]),
    ],
)
def test_unsqueeze_chain_becomes_one(shape: Shape, first: list[int], second: list[int], want: list[int]) -> None:
    model = chain_model("Unsqueeze", shape, [first, second])
    after, modified = run_pass(MergeSqueezeChains(), model)
    assert modified and ops(after) == ["Unsqueeze"] and after.graph.node[0].name == "Unsqueeze1"
    assert merged_axes(after) == want
    assert_same_numbers(model, after, {"seq": 4})
    (x,) = feed_for(model, {"seq": 4}).values()
    (y,) = run(after, {"x": x})
    assert y.shape == np.expand_dims(np.expand_dims(x, first), second).shape


def test_three_unsqueezes_become_one_and_a_second_run_changes_nothing() -> None:
    model = chain_model("Unsqueeze", (2, 3), [[0], [-1], [2]])
    after, modified = run_pass(MergeSqueezeChains(), model)
    assert modified and ops(after) == ["Unsqueeze"] and merged_axes(after) == [0, 2, 4]
    assert_same_numbers(model, after)
    again, modified = run_pass(MergeSqueezeChains(), after)
    assert not modified and ops(again) == ["Unsqueeze"]


@pytest.mark.parametrize(
    ("shape", "first", "second", "want"),
    [
        ((1, 2, 1), [0], [-1], [0, 2]),
        ((2, 1, 1, 3, 1), [-1, 1], [1], [1, 2, 4]),
        ((1, 1, 1), [1], [0, 1], [0, 1, 2]),
    ],
)
def test_squeeze_chain_becomes_one(shape: Shape, first: list[int], second: list[int], want: list[int]) -> None:
    model = chain_model("Squeeze", shape, [first, second])
    after, modified = run_pass(MergeSqueezeChains(), model)
    assert modified and ops(after) == ["Squeeze"] and merged_axes(after) == want
    assert_same_numbers(model, after)


def test_attribute_axes_before_opset_13_merge_into_the_attribute() -> None:
    model = chain_model("Unsqueeze", (2, 3), [[0], [-1]], opset=11)
    after, modified = run_pass(MergeSqueezeChains(), model)
    assert modified and ops(after) == ["Unsqueeze"] and merged_axes(after) == [0, 3]
    assert not after.graph.initializer
    assert_same_numbers(model, after)


@pytest.mark.parametrize(
    ("shape", "kwargs", "reason"),
    [
        ((2, 3), {"extra_reader": True}, "read elsewhere"),
        ((2, 3), {"inner_is_output": True}, "read elsewhere"),
        (None, {}, "cannot be merged for input rank None"),  # negative axes on an input of unknown rank
    ],
)
def test_chain_that_cannot_merge_is_left(shape: Shape, kwargs: dict[str, bool], reason: str) -> None:
    model = chain_model("Unsqueeze", shape, [[0], [-1]], **kwargs)
    after, modified = run_pass(MergeSqueezeChains(), model)
    assert not modified and ops(after).count("Unsqueeze") == 2
    graph = gs.import_onnx(model)
    outer = next(n for n in graph.nodes if n.name == "Unsqueeze1")
    assert reason in str(MergeSqueezeChains().check(outer, Facts(graph)))
    assert_same_numbers(model, after)


def test_squeeze_with_empty_axes_is_left() -> None:
    """An empty axes list: not a list of axes to merge (a Squeeze without axes removes every dim of size 1)."""
    x = gs.Variable("x", dtype=np.float32, shape=(1, 2, 1))
    t, y = gs.Variable("t", dtype=np.float32), gs.Variable("y", dtype=np.float32)
    nodes = [
        gs.Node("Squeeze", "inner", inputs=[x, gs.Constant("a0", np.zeros((0,), np.int64))], outputs=[t]),
        gs.Node("Squeeze", "outer", inputs=[t, gs.Constant("a1", np.array([0], np.int64))], outputs=[y]),
    ]
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=18)
    assert MergeSqueezeChains().check(nodes[1], Facts(graph)) == "empty axes"
    assert not MergeSqueezeChains()(graph, Settings()).modified


def test_unknown_rank_with_non_negative_axes_merges() -> None:
    model = chain_model("Unsqueeze", None, [[0], [2]])
    after, modified = run_pass(MergeSqueezeChains(), model)
    assert modified and merged_axes(after) == [0, 2]
    assert_same_numbers(model, after)


def test_merged_axes_match_numpy_for_every_small_case() -> None:
    """Every valid pair of axes lists (negative ones too) for ranks 0-3: one expand_dims equals two, and the same
    for squeeze; without the rank, only non-negative axes merge, to the same axes."""
    for rank in range(4):
        x = np.zeros(tuple(range(2, 2 + rank)))
        for first in _axes_lists(rank + 1, rank + 2):
            middle = np.expand_dims(x, first)
            for second in _axes_lists(middle.ndim + 1, middle.ndim + 2):
                got = merged_unsqueeze_axes(first, second, rank)
                assert got is not None and np.expand_dims(x, got).shape == np.expand_dims(middle, second).shape
                unknown = merged_unsqueeze_axes(first, second, None)
                assert unknown == (got if min(first + second) >= 0 else None)
    for rank in range(1, 5):
        for ones in itertools.product((False, True), repeat=rank):
            x = np.zeros(tuple(1 if one else 2 + i for i, one in enumerate(ones)))
            for first in _squeezable(x):
                middle = np.squeeze(x, first)
                for second in _squeezable(middle):
                    got = merged_squeeze_axes(first, second, rank)
                    assert got is not None and np.squeeze(x, tuple(got)).shape == np.squeeze(middle, second).shape


def test_invalid_axes_do_not_merge() -> None:
    assert merged_unsqueeze_axes([0, 0], [1], 2) is None  # repeated
    assert merged_unsqueeze_axes([3], [0], 2) is None  # out of range for rank 2 + 1
    assert merged_squeeze_axes([0], [-3], 2) is None  # out of range for rank 2 - 1


def _axes_lists(one: int, two: int) -> list[tuple[int, ...]]:
    """Every list of one axis of rank ``one`` and of two distinct axes of rank ``two``, in both signs."""
    lists = [(a,) for a in range(-one, one)]
    return lists + [p for p in itertools.permutations(range(-two, two), 2) if p[0] % two != p[1] % two]


def _squeezable(x: np.ndarray) -> list[tuple[int, ...]]:
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    lists: list[tuple[int, ...]] = []
    for count in range(1, len(ones) + 1):
        for chosen in itertools.combinations(ones, count):
            lists += itertools.product(*[(a, a - x.ndim) for a in chosen])
    return lists


# -- chains of scalings ----------------------------------------------------------------------------------------------


def scale_chain(first: str, second: str, a: np.ndarray, b: np.ndarray, *, shape: Shape = (2, 3)) -> onnx.ModelProto:
    """x -> first(x, a) -> second(., b) -> Abs -> y."""
    nodes = [
        helper.make_node(first, ["x", "a"], ["t"], name="inner"),
        helper.make_node(second, ["t", "b"], ["u"], name="outer"),
        helper.make_node("Abs", ["u"], ["y"], name="abs"),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, None)], {"a": a, "b": b})


@pytest.mark.parametrize(("first", "second"), list(itertools.product(("Mul", "Div"), repeat=2)))
def test_two_scalings_become_one_mul_within_an_ulp(first: str, second: str) -> None:
    model = scale_chain(first, second, np.array(3.0, np.float32), np.array([0.7], np.float32))
    after, modified = run_pass(MergeScaleChains(), model)
    assert modified and ops(after) == ["Mul", "Abs"]
    feed = feed_for(model)
    (want,), (got,) = run(model, feed), run(after, feed)
    np.testing.assert_allclose(got, want, rtol=2 * np.finfo(np.float32).eps)
    assert after.graph.node[0].input[0] == "x"


def test_divide_then_multiply_by_one_value_leaves_x_in_the_default_list() -> None:
    model = scale_chain("Div", "Mul", np.array([1.5], np.float32), np.array([1.5], np.float32))
    graph, _ = PassManager(default_passes(), max_iterations=4).run(gs.import_onnx(model), Settings())
    after = gs.export_onnx(graph)
    assert ops(after) == ["Abs"]


@pytest.mark.parametrize(
    ("a", "b", "shape", "reason"),
    [
        (np.array(0.0, np.float32), np.array(2.0, np.float32), (2, 3), "not a finite non-zero float"),
        (np.array(2.0, np.float32), np.array([1.0, 2.0, 3.0], np.float32), (2, 3), "no one-element constant"),
        (np.array(2.0, np.float32), np.ones((1, 1, 1), np.float32), (2, 3), "raises the rank"),
        (np.array(2.0, np.float64), np.array(2.0, np.float64), (2, 3), "dtype"),
    ],
)
def test_scalings_that_cannot_merge_are_left(a: np.ndarray, b: np.ndarray, shape: Shape, reason: str) -> None:
    if a.dtype == np.float64:  # the ONNX checker refuses mixed types: a float64 x with float32 constants
        a, b = a.astype(np.float32), b.astype(np.float32)
        nodes = [
            helper.make_node("Mul", ["x", "a"], ["t"], name="inner"),
            helper.make_node("Mul", ["t", "b"], ["u"], name="outer"),
            helper.make_node("Abs", ["u"], ["y"], name="abs"),
        ]
        model = onnx_model(nodes, [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, None)], {"a": a, "b": b})
        graph = gs.import_onnx(model)
        graph.inputs[0].dtype = np.float64  # what the pass reads: x's dtype against the constants'
    else:
        graph = gs.import_onnx(scale_chain("Mul", "Mul", a, b, shape=shape))
    outer = next(n for n in graph.nodes if n.name == "outer")
    assert reason in str(MergeScaleChains().reason(outer, Facts(graph)))


def test_a_scaled_value_read_elsewhere_is_left() -> None:
    nodes = [
        helper.make_node("Mul", ["x", "a"], ["t"], name="inner"),
        helper.make_node("Mul", ["t", "b"], ["u"], name="outer"),
        helper.make_node("Add", ["u", "t"], ["y"], name="add"),
    ]
    constants = {"a": np.array(2.0, np.float32), "b": np.array(3.0, np.float32)}
    model = make_model(nodes, [("x", TensorProto.FLOAT, (2, 3))], [("y", TensorProto.FLOAT, None)], constants)
    _, modified = run_pass(MergeScaleChains(), model)
    assert not modified


def test_tensorrt_rtx_builds_the_chain_its_compiler_failed_on() -> None:
    """AutoencoderRAE's decoder: x / c * c between two Reshapes feeding a MatMul fails inside Myelin; merged, it
    builds."""
    from rtx_build import rtx_build_error

    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["t", "s4"], ["r"]),
        helper.make_node("Div", ["r", "c"], ["d"]),
        helper.make_node("Mul", ["d", "c2"], ["m"]),
        helper.make_node("Reshape", ["m", "s3"], ["r2"]),
        helper.make_node("Transpose", ["r2"], ["t2"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["t2", "w"], ["y"]),
    ]
    constants = {
        "s4": np.array([1, 64, 16, 16], np.int64),
        "s3": np.array([1, 64, 256], np.int64),
        "c": np.array([1.5], np.float32),
        "c2": np.array([2.5], np.float32),
        "w": np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32),
    }
    model = onnx_model(nodes, [("x", TensorProto.FLOAT, (1, 256, 64))], [("y", TensorProto.FLOAT, None)], constants)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # the exporter records inner types too
    error = rtx_build_error(model)
    assert error is not None and "Myelin" in error, f"TensorRT-RTX built the chain: the rule may be unneeded ({error})"
    after, modified = run_pass(MergeScaleChains(), model)
    assert modified and "Div" not in ops(after)
    assert rtx_build_error(after) is None
    feed = feed_for(model)
    np.testing.assert_allclose(run(after, feed)[0], run(model, feed)[0], rtol=1e-5, atol=1e-3)


# -- in the default list ---------------------------------------------------------------------------------------------


def test_default_list_runs_them_after_folding() -> None:
    names = [p.name for p in default_passes()]
    fold = names.index("fold_constants")
    assert fold < names.index("merge_scale_chains") < names.index("remove_identity_elements")
    assert names.index("explicit_squeeze_axes") < names.index("merge_squeeze_chains")


def test_default_list_removes_a_folded_zero_and_merges_unsqueezes_of_constant_nodes() -> None:
    """The zero and the axes come from Constant nodes and arithmetic: folding turns them into constants first."""
    zero = numpy_helper.from_array(np.zeros((1, 3), np.float32))
    nodes = [
        helper.make_node("Constant", [], ["z"], name="zero", value=zero),
        helper.make_node("Mul", ["z", "two"], ["z2"], name="twice"),
        helper.make_node("Add", ["x", "z2"], ["a"], name="add"),
        helper.make_node("Constant", [], ["axes0"], name="axes0", value_ints=[0]),
        helper.make_node("Unsqueeze", ["a", "axes0"], ["u"], name="u0"),
        helper.make_node("Unsqueeze", ["u", "axes1"], ["y"], name="u1"),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, (2, 3))],
        [("y", TensorProto.FLOAT, (1, 2, 3, 1))],
        {"two": np.array(2.0, np.float32), "axes1": np.array([-1], np.int64)},
    )
    graph, _ = PassManager(default_passes(), max_iterations=4).run(gs.import_onnx(model), Settings())
    after = gs.export_onnx(graph)
    after.ir_version = model.ir_version
    onnx.checker.check_model(after, full_check=True)
    assert ops(after) == ["Unsqueeze"] and merged_axes(after) == [0, 3]
    assert_same_numbers(model, after)
