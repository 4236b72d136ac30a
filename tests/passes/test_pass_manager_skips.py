"""The pass manager does not run a pass again on a graph it already left as it is: the records say which ran, and
the result is the one running every pass on every iteration gives."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from test_folding_matches_graph_surgeon import CASES
from test_onnx_import import chain

from converters.settings import Settings
from passes import PassManager, PassResult, default_passes, to_graph


class Scripted:
    """Reports a modification on its first ``changes`` calls."""

    def __init__(self, name: str, changes: int = 0, settled: bool = False) -> None:
        self.name = name
        self.changes = changes
        self.settled = settled
        self.calls = 0

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        self.calls += 1
        return PassResult(graph, self.calls <= self.changes, settled=self.settled)


def ran(passes: list[Scripted]) -> list[tuple[str, int]]:
    graph = gs.Graph(opset=18)
    _, records = PassManager(passes, max_iterations=4).run(graph, Settings())
    return [(r.name, r.iteration) for r in records]


def test_passes_after_the_last_change_are_not_run_again() -> None:
    passes = [Scripted("a"), Scripted("b", changes=1), Scripted("c")]
    assert ran(passes) == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1)]


def test_a_settled_pass_is_not_run_again_on_its_own_result() -> None:
    passes = [Scripted("a"), Scripted("b", changes=1, settled=True), Scripted("c")]
    assert ran(passes) == [("a", 0), ("b", 0), ("c", 0), ("a", 1)]


def test_a_change_makes_every_other_pass_run_again() -> None:
    passes = [Scripted("a", changes=2), Scripted("b", changes=1, settled=True), Scripted("c")]
    assert ran(passes) == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1), ("a", 2)]


def run_every_pass(graph: gs.Graph, max_iterations: int) -> gs.Graph:
    """The manager without skipping: every pass on every iteration, until an iteration changes nothing."""
    for _ in range(max_iterations):
        changed = False
        for graph_pass in default_passes():
            result = graph_pass(graph, Settings())
            graph, changed = result.graph, changed or result.modified
        if not changed:
            break
    return graph


@pytest.mark.parametrize("name", ["chain", *sorted(CASES)])
def test_skipping_gives_what_running_every_pass_gives(name: str) -> None:
    model = chain(20) if name == "chain" else CASES[name]
    skipped, _ = PassManager(default_passes(), max_iterations=4).run(to_graph(model)[0], Settings())
    full = run_every_pass(to_graph(model)[0], 4)
    assert [(n.op, n.name, [t.name for t in n.inputs]) for n in skipped.nodes] == [
        (n.op, n.name, [t.name for t in n.inputs]) for n in full.nodes
    ]
    constants = {t.name: t.values for t in skipped.tensors().values() if isinstance(t, gs.Constant)}
    expected = {t.name: t.values for t in full.tensors().values() if isinstance(t, gs.Constant)}
    assert constants.keys() == expected.keys()
    for key, value in constants.items():
        np.testing.assert_array_equal(value, expected[key])
