"""ONNX graph passes: the pass API, the pass manager and the built-in passes."""

from passes.base import GraphPass, PassManager, PassRecord, PassResult
from passes.cleanup import RemoveDeadNodes, RemoveIdentities, TopologicalSort
from passes.defaults import default_passes
from passes.folding import FoldConstants
from passes.onnx_io import to_graph, to_model

__all__ = [
    "FoldConstants",
    "GraphPass",
    "PassManager",
    "PassRecord",
    "PassResult",
    "RemoveDeadNodes",
    "RemoveIdentities",
    "TopologicalSort",
    "default_passes",
    "to_graph",
    "to_model",
]
