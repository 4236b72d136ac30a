"""The pass manager and the built-in passes, on small graphs built with graph-surgeon."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest

from converters.errors import ConversionError
from converters.settings import Settings
from passes import (
    FoldConstants,
    PassManager,
    PassResult,
    RemoveDeadNodes,
    RemoveIdentities,
    TopologicalSort,
    default_passes,
    to_graph,
    to_model,
)


def chain_graph() -> gs.Graph:
    """x -> Identity -> Add(const folded from Mul of two constants) -> Relu -> y, plus a dead branch."""
    x = gs.Variable("x", dtype=np.float32, shape=(2, 3))
    a = gs.Constant("a", np.full((2, 3), 2.0, np.float32))
    b = gs.Constant("b", np.full((2, 3), 3.0, np.float32))
    ab = gs.Variable("ab", dtype=np.float32, shape=(2, 3))
    xi = gs.Variable("xi", dtype=np.float32, shape=(2, 3))
    s = gs.Variable("s", dtype=np.float32, shape=(2, 3))
    y = gs.Variable("y", dtype=np.float32, shape=(2, 3))
    dead = gs.Variable("dead", dtype=np.float32, shape=(2, 3))
    nodes = [
        gs.Node("Relu", "relu", inputs=[s], outputs=[y]),  # out of order on purpose
        gs.Node("Mul", "mul", inputs=[a, b], outputs=[ab]),
        gs.Node("Identity", "ident", inputs=[x], outputs=[xi]),
        gs.Node("Add", "add", inputs=[xi, ab], outputs=[s]),
        gs.Node("Neg", "neg", inputs=[x], outputs=[dead]),
    ]
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=18)


def run(graph: gs.Graph, x: np.ndarray) -> np.ndarray:
    model = gs.export_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_default_passes_clean_fold_and_sort() -> None:
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    graph, records = PassManager(default_passes(), max_iterations=3).run(chain_graph(), Settings())
    assert [n.op for n in graph.nodes] == ["Add", "Relu"]
    np.testing.assert_allclose(run(graph, x), np.maximum(x + 6.0, 0.0), rtol=1e-6)
    assert {r.name for r in records if r.modified} >= {"remove_identities", "fold_constants", "toposort"}
    last_iteration = [r for r in records if r.iteration == records[-1].iteration]
    assert not any(r.modified for r in last_iteration)  # the manager stopped because nothing changed
    first = records[0]
    assert (first.name, first.nodes_before, first.nodes_after) == ("remove_identities", 5, 3)


def test_fold_respects_size_threshold() -> None:
    settings = Settings(fold_size_threshold=8)  # the folded Mul would be 24 bytes: too big to materialise
    graph = FoldConstants()(chain_graph(), settings).graph
    assert "Mul" in [n.op for n in graph.nodes]
    graph = FoldConstants()(chain_graph(), Settings()).graph
    assert "Mul" not in [n.op for n in graph.nodes]


def test_identity_feeding_a_graph_output_is_kept() -> None:
    x = gs.Variable("x", dtype=np.float32, shape=(2,))
    y = gs.Variable("y", dtype=np.float32, shape=(2,))
    graph = gs.Graph(nodes=[gs.Node("Identity", "i", inputs=[x], outputs=[y])], inputs=[x], outputs=[y], opset=18)
    result = RemoveIdentities()(graph, Settings())
    assert not result.modified and [n.op for n in result.graph.nodes] == ["Identity"]


def test_dead_node_removal_keeps_unused_inputs() -> None:
    graph = chain_graph()
    unused = gs.Variable("unused", dtype=np.float32, shape=(1,))
    graph.inputs.append(unused)
    result = RemoveDeadNodes()(graph, Settings())
    assert result.modified and "Neg" not in [n.op for n in result.graph.nodes]
    assert [t.name for t in result.graph.inputs] == ["x", "unused"]


def test_toposort_unmodified_on_sorted_graph() -> None:
    graph = TopologicalSort()(chain_graph(), Settings()).graph
    assert not TopologicalSort()(graph, Settings()).modified


class Exploding:
    name = "exploding"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        raise ValueError("boom")


def test_error_names_the_pass_and_the_passes_before_it() -> None:
    manager = PassManager((RemoveIdentities(), RemoveDeadNodes(), Exploding()))
    with pytest.raises(
        ConversionError,
        match=r"pass 'exploding' failed: ValueError: boom; passes run before it: "
        r"remove_identities, remove_dead_nodes",
    ):
        manager.run(chain_graph(), Settings())


def test_duplicate_pass_names_rejected() -> None:
    with pytest.raises(ConversionError, match=r"names toposort more than once"):
        PassManager((TopologicalSort(), TopologicalSort()))


def test_pass_returning_the_wrong_type() -> None:
    class Sloppy:
        name = "sloppy"

        def __call__(self, graph: gs.Graph, settings: Settings) -> gs.Graph:
            return graph

    with pytest.raises(ConversionError, match=r"returned Graph, not PassResult"):
        PassManager((Sloppy(),)).run(chain_graph(), Settings())  # type: ignore[arg-type]


def test_round_trip_keeps_node_metadata_for_derived_names() -> None:
    model = gs.export_onnx(chain_graph())
    for node in model.graph.node:
        node.metadata_props.add(key="namespace", value=f"blocks.0/{node.name}")
    graph, metadata = to_graph(model)
    add = next(n for n in graph.nodes if n.name == "add")
    add.name = "add/lowered_0"  # what a converter does: derive from the replaced node's name
    back = to_model(graph, model, metadata)
    props = {n.name: {p.key: p.value for p in n.metadata_props} for n in back.graph.node}
    assert props["add/lowered_0"] == {"namespace": "blocks.0/add"}
    assert props["relu"] == {"namespace": "blocks.0/relu"}
