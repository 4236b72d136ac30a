"""Constant folding with a size threshold, so large weights are not duplicated."""

from __future__ import annotations

import logging

import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import PassResult

logger = logging.getLogger(__name__)


class FoldConstants:
    """Evaluate nodes whose inputs are all constant (on ONNX Runtime, through graph-surgeon).

    A folded result larger than ``settings.fold_size_threshold`` bytes is not materialised: folding a Transpose
    of a weight that other nodes still read would otherwise store the weight twice. Shape computations on static
    shapes are folded too (``fold_shapes``).
    """

    name = "fold_constants"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        before = _fingerprint(graph)
        graph.fold_constants(fold_shapes=True, size_threshold=settings.fold_size_threshold, error_ok=True)
        graph.cleanup(remove_unused_graph_inputs=False)
        return PassResult(graph, _fingerprint(graph) != before)


def _fingerprint(graph: gs.Graph) -> tuple[int, int]:
    constants = sum(isinstance(t, gs.Constant) for node in graph.nodes for t in node.inputs)
    return len(graph.nodes), constants
