"""The fast export writes exactly the bytes ``gs.export_onnx`` writes, on imported graphs, graphs the default passes
changed, and graphs built to hit the exporter's corners."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from test_onnx_import import chain, corners

from converters.settings import Settings
from passes import PassManager, default_passes
from passes.model_io.onnx_export import export_onnx
from passes.model_io.onnx_import import import_onnx


def flat_corners() -> gs.Graph:
    """The importer's corner cases without the If node (a subgraph sends the export to graph-surgeon)."""
    model = corners()
    nodes = [n for n in model.graph.node if n.op_type != "If"]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return gs.import_onnx(model)


def after_passes() -> gs.Graph:
    graph = gs.import_onnx(chain(30))
    return PassManager(default_passes(), max_iterations=4).run(graph, Settings())[0]


def built() -> gs.Graph:
    """Constants as arrays (with an export dtype, a data location, sharing one lazy proto under two names), value
    info of every kind, shapes with parameters, unknown and numpy-typed dims, a node without name or domain."""
    shared = numpy_helper.from_array(np.ones(3, np.float32), "w_first")
    lazy_a = gs.Constant("w_a", gs.ir.tensor.LazyValues(shared))
    lazy_b = gs.Constant("w_b", gs.ir.tensor.LazyValues(shared))  # graph-surgeon renames the shared proto twice
    located = gs.Constant("located", np.arange(3, dtype=np.int64), data_location=TP.DEFAULT)
    half = gs.Constant("half", np.ones(3, np.float32))
    x = gs.Variable("x", np.float32, ["n", 3])
    a = gs.Variable("a", np.float32, [None, 3])
    a2 = gs.Variable("a2", np.float32, [5, 3])  # a second type of the same dtype and rank
    b = gs.Variable("b", np.float64, [])
    c = gs.Variable("c", None, None)
    d = gs.Variable("d", TP.BFLOAT16, [3])
    e = gs.Variable("e", np.float32, [3], type="sequence_type")
    f = gs.Variable("f", np.dtype("float16"), (3,))
    y = gs.Variable("y", np.float32, [3])
    nodes = [
        gs.Node("Add", "add", inputs=[x, lazy_a], outputs=[a]),
        gs.Node("Neg", "neg", inputs=[a], outputs=[a2]),
        gs.Node("Mul", "mul", inputs=[a2, lazy_b], outputs=[b], domain=""),
        gs.Node("Custom", "", {"f": 0.5, "ints": [1, 2], "s": "text", "t": half}, [b, located], [c], "com.x"),
        gs.Node("Cast", "cast", {"to": TP.BFLOAT16}, [c], [d]),
        gs.Node("SequenceConstruct", "seq", inputs=[d], outputs=[e]),
        gs.Node("Custom", "custom2", inputs=[e, gs.Variable.empty()], outputs=[f], domain="com.x"),
        gs.Node("Relu", "relu", inputs=[f], outputs=[y]),
    ]
    return gs.Graph(nodes, [x], [y], name="built", doc_string="doc", opset=18, producer_name="p")  # no IR version


GRAPHS: dict[str, Callable[[], gs.Graph]] = {
    "chain": lambda: gs.import_onnx(chain(20)),
    "flat_corners": flat_corners,
    "after_passes": after_passes,
    "built": built,
    "subgraph": lambda: gs.import_onnx(corners()),
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_export_writes_what_graph_surgeon_writes(name: str) -> None:
    ours = export_onnx(GRAPHS[name]()).SerializeToString()
    assert ours == gs.export_onnx(GRAPHS[name]()).SerializeToString()
    graph = GRAPHS[name]()  # the same graph twice: what the first export changes, the second sees
    theirs = gs.export_onnx(graph).SerializeToString()
    assert export_onnx(graph).SerializeToString() == theirs == ours


def test_export_of_the_fast_import_round_trips() -> None:
    model = chain(10)
    assert (
        export_onnx(import_onnx(model)).SerializeToString() == gs.export_onnx(gs.import_onnx(model)).SerializeToString()
    )


@pytest.mark.parametrize(
    "tensor",
    [
        gs.Variable("v", None, [2]),  # a shape without a dtype: graph-surgeon's type check fails
        gs.Variable("v", np.float32, [np.int64(2)]),  # make_tensor_type_proto takes ints, not numpy integers
    ],
)
def test_export_fails_where_graph_surgeon_fails(tensor: gs.Variable) -> None:
    x = gs.Variable("x", np.float32, [2])
    before = gs.Variable("before", np.float32, [2])  # the type that was made already, for the same dims as ints
    y = gs.Variable("y", np.float32, [2])
    nodes = [gs.Node("Neg", inputs=[x], outputs=[before]), gs.Node("Neg", inputs=[before], outputs=[tensor])]
    graph = gs.Graph([*nodes, gs.Node("Neg", inputs=[tensor], outputs=[y])])
    graph.inputs, graph.outputs = [x], [y]
    with pytest.raises(Exception) as theirs:
        gs.export_onnx(graph)
    with pytest.raises(type(theirs.value)):
        export_onnx(graph)


def test_export_is_a_valid_model() -> None:
    model = export_onnx(after_passes())
    onnx.checker.check_model(model, full_check=True)
    assert helper.printable_graph(model.graph)
