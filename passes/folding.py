"""Constant folding with a size threshold, so large weights are not duplicated."""

from __future__ import annotations

import logging

import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import PassResult

logger = logging.getLogger(__name__)

#: IR version 10 (onnx 1.16) is read by every ONNX Runtime this project supports.
FOLDING_IR_VERSION = 10


class FoldConstants:
    """Evaluate nodes whose inputs are all constant (on ONNX Runtime, through graph-surgeon).

    A folded result larger than ``settings.fold_size_threshold`` bytes is not materialised: folding a Transpose
    of a weight that other nodes still read would otherwise store the weight twice. Shape computations on static
    shapes are folded too (``fold_shapes``).
    """

    name = "fold_constants"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        before = _fingerprint(graph)
        if graph.ir_version is None:
            # graph-surgeon folds by exporting to ONNX Runtime; without an IR version it writes onnx's newest,
            # which ONNX Runtime may reject, and the fold then fails silently.
            graph.ir_version = FOLDING_IR_VERSION
        graph.fold_constants(fold_shapes=True, size_threshold=settings.fold_size_threshold, error_ok=True)
        graph.cleanup(remove_unused_graph_inputs=False)
        return PassResult(graph, _fingerprint(graph) != before)


def _fingerprint(graph: gs.Graph) -> tuple[int, int]:
    constants = sum(isinstance(t, gs.Constant) for node in graph.nodes for t in node.inputs)
    return len(graph.nodes), constants
