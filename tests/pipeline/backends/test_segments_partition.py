"""The partition of a final graph into TensorRT and ONNX Runtime segments (``pipeline.runtime.segments.partition``)
on small hand-written graphs: the values a node reads (subgraphs included), the names of nested nodes, the order the
runs take, the trivial ops, each segment's inputs and outputs, and a segment as a model of its own. Nothing is
converted or built (the segmented backend end to end is test_segments.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from pipeline.runtime.segments.partition import (
    ORT_SEGMENT,
    TENSORRT_SEGMENT,
    Segment,
    compute_nodes,
    partition,
    segment_model,
    top_level_names,
    used_values,
)


def vector(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [4])


def model_of(
    nodes: list[onnx.NodeProto], outputs: list[str], initializers: list[onnx.TensorProto] | None = None
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [vector("x")], [vector(o) for o in outputs], initializers or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def kinds_and_nodes(segments: tuple[Segment, ...]) -> list[tuple[str, tuple[int, ...]]]:
    return [(s.kind, s.nodes) for s in segments]


def test_the_segment_kinds() -> None:
    assert (TENSORRT_SEGMENT, ORT_SEGMENT) == ("tensorrt", "onnxruntime")


def test_a_node_reads_its_inputs_and_its_subgraphs_outer_values_once() -> None:
    inner = helper.make_graph(
        [
            helper.make_node("Add", ["i", "w"], ["t"]),  # i: the body's input, w: its initializer
            helper.make_node("Mul", ["t", "outer"], ["u"]),
            helper.make_node("Mul", ["u", "outer"], ["r"]),  # outer again: listed once
        ],
        "body",
        [vector("i")],
        [vector("r")],
        [numpy_helper.from_array(np.ones(4, np.float32), "w")],
    )
    node = helper.make_node("If", ["flag", ""], ["y"], then_branch=inner, else_branch=inner)
    assert used_values(node) == ["flag", "outer"]
    nested = helper.make_graph([node], "nested", [], [vector("y")])
    outer_if = helper.make_node("If", ["c"], ["z"], then_branch=nested, else_branch=nested)
    assert used_values(outer_if) == ["c", "flag", "outer"]  # the values the nested If reads, two levels down
    scan_like = helper.make_node("Loop", ["n", "", "flag"], ["y"])
    scan_like.attribute.append(helper.make_attribute("bodies", [inner, nested]))  # a GRAPHS attribute
    assert used_values(scan_like) == ["n", "flag", "outer"]


def test_a_subgraphs_sparse_initializer_is_defined_inside_it() -> None:
    """A sparse initializer inside a branch is the branch's own value, not one it reads from outside (its name is
    ``values.name``: ``SparseTensorProto`` has no ``name``; reading it raised AttributeError)."""
    body = helper.make_graph([helper.make_node("Add", ["sparse", "outer"], ["r"])], "body", [], [vector("r")])
    body.sparse_initializer.append(
        helper.make_sparse_tensor(
            numpy_helper.from_array(np.ones(1, np.float32), "sparse"), numpy_helper.from_array(np.array([0])), [4]
        )
    )
    node = helper.make_node("If", ["flag"], ["y"], then_branch=body, else_branch=body)
    assert used_values(node) == ["flag", "outer"]


def test_nested_node_names_map_to_their_top_level_node() -> None:
    inner = helper.make_graph(
        [helper.make_node("Neg", ["a"], ["t"], name="inner"), helper.make_node("Neg", ["t"], ["u"], name="shared")],
        "then",
        [],
        [vector("u")],
    )
    deeper = helper.make_graph(
        [helper.make_node("If", ["f"], ["w"], name="middle", then_branch=inner, else_branch=inner)], "d", [], []
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"], name="first"),
            helper.make_node("If", ["f"], ["y"], name="if", then_branch=deeper, else_branch=inner),
            helper.make_node("Neg", ["y"], ["z"]),  # no name: not listed
            helper.make_node("Abs", ["z"], ["s"], name="shared"),  # top level: wins over the nested "shared"
            helper.make_node("If", ["f"], ["q"], name="later_if", then_branch=inner, else_branch=inner),
        ],
        "g",
        [vector("x")],
        [vector("s")],
    )
    names = top_level_names(graph)
    assert names == {"first": 0, "if": 1, "middle": 1, "inner": 1, "shared": 3, "later_if": 4}


def test_trivial_ops_do_no_work() -> None:
    trivial = ["Constant", "Identity", "Cast", "Shape", "Reshape", "Squeeze", "Unsqueeze", "Flatten"]
    nodes = [helper.make_node(op, [], [f"o{i}"]) for i, op in enumerate([*trivial, "Relu", "MatMul"])]
    model = model_of(nodes, [])
    assert compute_nodes(model, range(len(trivial))) == 0
    assert compute_nodes(model, range(len(nodes))) == 2 and compute_nodes(model, [8]) == 1


def test_no_exclusion_is_one_tensorrt_segment_and_all_excluded_one_onnx_runtime_segment() -> None:
    weight = numpy_helper.from_array(np.full(4, 2.0, np.float32), "w")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["c"]),
    ]
    model = model_of(nodes, ["c", "a"], [weight])
    [whole] = partition(model, excluded=[])
    assert whole == Segment(TENSORRT_SEGMENT, (0, 1, 2), ("x",), ("a", "c"))  # graph outputs, in node order
    [whole] = partition(model, excluded=[0, 1, 2])
    assert whole == Segment(ORT_SEGMENT, (0, 1, 2), ("x",), ("a", "c"))


def test_the_order_stays_on_a_label_while_it_has_ready_nodes_and_starts_with_the_first_node() -> None:
    """Two independent chains, interleaved in graph order (TensorRT 0 -> 2, ONNX Runtime 1 -> 3): two segments, not
    four; and the chain whose node comes first in graph order runs first, whichever label it has."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["x"], ["b"]),
        helper.make_node("Relu", ["a"], ["c"]),
        helper.make_node("Neg", ["b"], ["d"]),
        helper.make_node("Add", ["c", "d"], ["e"]),
    ]
    model = model_of(nodes, ["e"])
    segments = partition(model, excluded=[1, 3])
    assert kinds_and_nodes(segments) == [("tensorrt", (0, 2)), ("onnxruntime", (1, 3)), ("tensorrt", (4,))]
    assert [(s.inputs, s.outputs) for s in segments] == [(("x",), ("c",)), (("x",), ("d",)), (("c", "d"), ("e",))]
    flipped = partition(model, excluded=[0, 2, 4])
    assert kinds_and_nodes(flipped) == [("onnxruntime", (0, 2)), ("tensorrt", (1, 3)), ("onnxruntime", (4,))]


def test_a_run_of_trivial_ops_counts_no_work_towards_the_minimum() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),  # excluded
        helper.make_node("Identity", ["b"], ["c"]),
        helper.make_node("Cast", ["c"], ["d"], to=TensorProto.FLOAT),
        helper.make_node("Neg", ["d"], ["e"]),  # excluded
        helper.make_node("Relu", ["e"], ["f"]),
        helper.make_node("Relu", ["f"], ["g"]),
    ]
    model = model_of(nodes, ["g"])
    assert kinds_and_nodes(partition(model, excluded=[1, 4], min_segment_size=1)) == [
        ("tensorrt", (0,)),
        ("onnxruntime", (1, 2, 3, 4)),  # Identity and Cast alone do no work: not worth an engine
        ("tensorrt", (5, 6)),
    ]
    assert kinds_and_nodes(partition(model, excluded=[1, 4], min_segment_size=2)) == [
        ("onnxruntime", (0, 1, 2, 3, 4)),
        ("tensorrt", (5, 6)),
    ]
    assert kinds_and_nodes(partition(model, excluded=[1, 4], min_segment_size=3)) == [("onnxruntime", tuple(range(7)))]


def test_a_value_read_by_several_later_segments_is_one_output() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),  # excluded
        helper.make_node("Add", ["a", "b"], ["c"]),
        helper.make_node("Neg", ["c"], ["d"]),  # excluded
        helper.make_node("Add", ["a", "d"], ["e"]),
        helper.make_node("Relu", ["x"], ["unused"]),  # read by nobody, not a graph output
    ]
    segments = partition(model_of(nodes, ["e", "a"]), excluded=[1, 3])
    assert kinds_and_nodes(segments) == [
        ("tensorrt", (0, 5)),
        ("onnxruntime", (1,)),
        ("tensorrt", (2,)),
        ("onnxruntime", (3,)),
        ("tensorrt", (4,)),
    ]
    assert segments[0].outputs == ("a",) and segments[2].inputs == ("a", "b") and segments[4].inputs == ("a", "d")


def test_a_segment_is_a_model_of_its_own_that_runs() -> None:
    weight = numpy_helper.from_array(np.full(4, 3.0, np.float32), "w")
    unused = numpy_helper.from_array(np.zeros(4, np.float32), "unused")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),  # excluded
        helper.make_node("Mul", ["b", "w"], ["c"]),
    ]
    model = model_of(nodes, ["c"], [weight, unused])
    model.ir_version = 9
    model.graph.name = "named"
    model.metadata_props.add(key="weights", value="dir")
    values = {name: vector(name) for name in ("x", "a", "b", "c")}
    segments = partition(model, excluded=[1])
    last = segment_model(model, segments[2], values)
    assert last.graph.name == "named_tensorrt_2" and [n.op_type for n in last.graph.node] == ["Mul"]
    assert [t.name for t in last.graph.initializer] == ["w"]
    assert [i.name for i in last.graph.input] == ["b"] and [o.name for o in last.graph.output] == ["c"]
    assert last.ir_version == 9 and list(last.opset_import) == list(model.opset_import)
    assert [(p.key, p.value) for p in last.metadata_props] == [("weights", "dir")]
    onnx.checker.check_model(last, full_check=True)
    session = ort.InferenceSession(last.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"b": np.arange(4, dtype=np.float32)})
    assert np.array_equal(out, np.arange(4, dtype=np.float32) * 3)
    model.graph.name = ""
    assert segment_model(model, segments[1], values).graph.name == "graph_onnxruntime_1"


def test_names_inside_a_graphs_attribute_map_to_their_node() -> None:
    body = helper.make_graph([helper.make_node("Neg", ["a"], ["t"], name="in_list")], "body", [], [vector("t")])
    holder = helper.make_node("Loop", ["n", "", "c"], ["y"], name="holder")
    holder.attribute.append(helper.make_attribute("bodies", [body]))  # a GRAPHS attribute
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="a"), holder], "g", [vector("x")], [])
    assert top_level_names(graph) == {"a": 0, "holder": 1, "in_list": 1}


def test_a_segment_model_keeps_the_models_local_functions() -> None:
    function = helper.make_function(
        "local", "Twice", ["v"], ["w"], [helper.make_node("Add", ["v", "v"], ["w"])], [helper.make_opsetid("", 18)]
    )
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Twice", ["a"], ["b"], domain="local")]
    model = model_of(nodes, ["b"])
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.functions.append(function)
    [whole] = partition(model, excluded=[])
    sub = segment_model(model, whole, {"x": vector("x"), "b": vector("b")})
    assert [f.name for f in sub.functions] == ["Twice"]
    onnx.checker.check_model(sub, full_check=True)


def test_a_graph_onnx_runtime_cannot_run_while_planning_segments_is_a_build_error() -> None:
    """ONNX Runtime failing on the final graph while the segments' shapes are observed (a Gather past its data) is a
    BuildError naming the node, never a raw ONNX Runtime error."""
    import numpy as np
    import onnx
    import pytest
    from onnx import TensorProto, helper

    from converters.errors import BuildError
    from pipeline.runtime.segments.shapes import observe
    from pipeline.settings import Settings

    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "index"], ["out"], name="past_the_end")],
        "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [0]),
         helper.make_tensor_value_info("index", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feed = {"data": np.zeros(0, np.float32), "index": np.zeros(1, np.int64)}
    with pytest.raises(BuildError, match="past_the_end"):
        observe(model, ["out"], [feed], Settings())
    onnx.checker.check_model(model)


def test_planning_segments_of_a_half_graph_reads_its_half_inputs_as_given() -> None:
    """A float16 graph input that planning asks about (a cache read by a segment) is not added as an output of the
    probe: an untyped output of that name made the CPU emulation leave the input float16 beside its float32 values,
    and ONNX Runtime refused T5Gemma's fp16 step for TensorRT-RTX ("Type parameter (T) of Optype (TensorScatter)")."""
    from pipeline.runtime.segments.shapes import observe
    from pipeline.settings import Settings

    half = TensorProto.FLOAT16
    graph = helper.make_graph(
        [helper.make_node("Mul", ["update", "update"], ["squared"], name="square"),
         helper.make_node("TensorScatter", ["cache", "squared", "at"], ["written"], name="kv_write")],
        "g",
        [helper.make_tensor_value_info("cache", half, [1, 4, 2]),
         helper.make_tensor_value_info("update", half, [1, 1, 2]),
         helper.make_tensor_value_info("at", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("written", half, [1, 4, 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    feed = {"cache": np.zeros((1, 4, 2), np.float16), "update": np.full((1, 1, 2), 3, np.float16)}
    feed["at"] = np.array([2], np.int64)
    seen = observe(model, ["cache", "squared", "written"], [feed], Settings(precision="fp16"))
    assert seen["cache"].dtype == "float16" and seen["cache"].shapes == ((1, 4, 2),)
    assert seen["squared"].shapes == ((1, 1, 2),) and seen["written"].dtype == "float16"
