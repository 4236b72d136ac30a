"""The fast import builds exactly the graph ``gs.import_onnx`` builds: every object's class, attributes (in order) and
values, which objects are shared, and who produces and consumes what; on graphs made to hit the importer's corners."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx_graphsurgeon.ir.tensor import LazyValues

from passes.model_io.onnx_import import import_onnx


class Describer:
    """A graph as plain data: objects are numbered in the order a walk meets them, so sharing shows."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}

    def ref(self, obj: object) -> int:
        return self.ids.setdefault(id(obj), len(self.ids))

    def graph(self, graph: gs.Graph) -> dict[str, Any]:
        fields = {k: v for k, v in vars(graph).items() if k not in ("nodes", "inputs", "outputs", "_functions")}
        return {
            "functions": (self.ref(graph._functions), [(f.name, f.domain) for f in graph.functions]),
            "fields": [(k, self.value(v)) for k, v in fields.items()],
            "inputs": [self.tensor(t) for t in graph.inputs],
            "outputs": [self.tensor(t) for t in graph.outputs],
            "nodes": [self.node(n) for n in graph.nodes],
            "tensors": [self.tensor(t) for t in graph.tensors().values()],
        }

    def node(self, node: gs.Node) -> dict[str, Any]:
        return {
            "ref": self.ref(node),
            "class": type(node),
            "keys": list(vars(node)),
            "op": node.op,
            "name": node.name,
            "domain": node.domain,
            "attrs": (type(node.attrs), [(k, self.value(v)) for k, v in node.attrs.items()]),
            "inputs": self.synced(node.inputs, node, "outputs"),
            "outputs": self.synced(node.outputs, node, "inputs"),
        }

    def tensor(self, tensor: gs.Tensor) -> dict[str, Any]:
        keys = list(vars(tensor))
        described: dict[str, Any] = {"ref": self.ref(tensor), "class": type(tensor), "keys": keys}
        for key in keys:
            if key in ("inputs", "outputs"):
                other = "outputs" if key == "inputs" else "inputs"
                described[key] = self.synced(getattr(tensor, key), tensor, other)
            else:
                described[key] = self.value(getattr(tensor, key))
        return described

    def synced(self, items: list[Any], parent: object, field_name: str) -> tuple[Any, ...]:
        assert vars(items) == {"parent_obj": parent, "field_name": field_name}
        assert all(any(p is parent for p in getattr(item, field_name)) for item in items)
        return type(items), [self.ref(item) for item in items]

    def value(self, value: Any) -> Any:
        if isinstance(value, gs.Tensor):
            return self.tensor(value)
        if isinstance(value, gs.Graph):
            return self.graph(value)
        if isinstance(value, LazyValues):
            return (type(value), id(value.tensor), type(value.shape), list(value.shape), value.dtype, value.nbytes)
        if isinstance(value, list | tuple):
            return self.ref(value), type(value), [self.value(v) for v in value]
        if isinstance(value, np.dtype):
            return "dtype", value, id(value)
        return type(value), value if not isinstance(value, onnx.OperatorSetIdProto) else id(value)


def describe(graph: gs.Graph) -> dict[str, Any]:
    return Describer().graph(graph)


def vi(name: str, shape: list[Any] | None, elem: int = TP.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, value: object) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def corners() -> onnx.ModelProto:
    """Every path of the importer: duplicate and sparse initializers, value info that fills in or adds nothing,
    initializers listed as inputs, omitted inputs and outputs, names no value info has, every attribute kind, a
    subgraph reading an outer tensor, domains set and not, shapes with parameters and unknown dims, sequence,
    bfloat16 and typeless value info, external data."""
    external = init("ext", np.ones(4, np.float32))
    external.data_location = TP.EXTERNAL
    external.ClearField("raw_data")
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", "16")):
        external.external_data.add(key=key, value=value)
    sparse = helper.make_sparse_tensor(
        init("sp", np.array([1.0, 2.0], np.float32)), init("sp_i", np.array([0, 3], np.int64)), [4]
    )
    branch = helper.make_graph([helper.make_node("Neg", ["w"], ["b_out"], name="neg_in_branch")], "branch", [], [])
    branch.output.extend([vi("b_out", [4])])
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"], name="add"),
        helper.make_node("Clip", ["a", "", "hi"], ["c"], name="clip"),
        helper.make_node("Mul", ["c", "unknown_in"], ["m"], name="mul", domain=""),
        helper.make_node(
            "Custom",
            ["m", "ext", "sp"],
            ["cu", ""],
            name="custom",
            domain="com.example",
            f=0.5,
            i=3,
            s="text",
            t=numpy_helper.from_array(np.arange(3, dtype=np.int64), "attr_tensor"),
            fs=[1.0, 2.0],
            is_=[1, 2],
            ss=["a", "b"],
        ),
        helper.make_node("If", ["cond"], ["if_out"], name="if", then_branch=branch, else_branch=branch),
        helper.make_node("Sum", ["cu", "if_out", "bf", "seq_len"], ["y"]),
        helper.make_node("Relu", ["y"], ["dead"], name="dead_relu"),
        helper.make_node("Custom", ["seq", "typeless"], ["z"], name="types", domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes,
        "corners",
        [vi("x", ["batch", 4]), vi("w", [4]), vi("cond", [], TP.BOOL), vi("bf", None, TP.BFLOAT16)],
        [vi("y", [None, 4]), vi("seq_len", [1], TP.INT64)],
        [init("w", np.full(4, 2.0, np.float32)), init("w", np.zeros(4, np.float32)), init("hi", 1.0), external],
        value_info=[
            vi("a", ["batch", 4]),
            vi("a", None, TP.DOUBLE),  # graph-surgeon keeps the first shape and takes the second's type (its quirk)
            vi("w", [4]),  # an initializer: graph-surgeon leaves the Constant alone
            vi("m", [2, 4], TP.DOUBLE),
            helper.make_tensor_sequence_value_info("seq", TP.FLOAT, [2]),
            helper.make_empty_tensor_value_info("typeless"),
            vi("cu", [], TP.BFLOAT16),
        ],
        sparse_initializer=[sparse],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10, producer_name="test", producer_version="1")


def chain(blocks: int) -> onnx.ModelProto:
    """What the exporter writes: shapes on every tensor (from shape inference), Constant nodes, shared weights."""
    nodes, previous = [], "x"
    for i in range(blocks):
        nodes += [
            helper.make_node("Constant", [], [f"c{i}"], name=f"const{i}", value=init("", np.float32(i))),
            helper.make_node("Add", [previous, f"c{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Mul", [f"a{i}", "scale"], [f"y{i}"], name=f"mul{i}"),
        ]
        previous = f"y{i}"
    graph = helper.make_graph(
        nodes, "chain", [vi("x", [2, 3])], [vi(previous, [2, 3])], [init("scale", np.float32(0.5))]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


MODELS = {
    "corners": corners,
    "chain": lambda: chain(20),
    "no_opset": lambda: helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [vi("x", [1])], [vi("y", [1])]),
        opset_imports=[helper.make_opsetid("com.example", 1)],
    ),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_import_builds_what_graph_surgeon_builds(name: str) -> None:
    model = MODELS[name]()
    ours = import_onnx(model)
    theirs = gs.import_onnx(model)
    assert describe(ours) == describe(theirs)
    assert ours.import_domains is theirs.import_domains is model.opset_import


def test_import_exports_what_graph_surgeon_exports() -> None:
    model = chain(5)
    exported = gs.export_onnx(import_onnx(model)).SerializeToString()
    assert exported == gs.export_onnx(gs.import_onnx(model)).SerializeToString()


def test_local_functions_go_to_graph_surgeon() -> None:
    function = helper.make_function("com.example", "F", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])], [])
    model = MODELS["no_opset"]()
    model.functions.append(function)
    graph = import_onnx(model)
    assert [f.name for f in graph.functions] == ["F"]
    assert describe(graph) == describe(gs.import_onnx(model))
