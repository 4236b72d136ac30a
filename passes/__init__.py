"""ONNX graph passes: the pass API, the pass manager and the built-in passes."""

from passes.base import GraphPass, PassManager, PassRecord, PassResult, insert_passes
from passes.cleanup import RemoveDeadNodes, RemoveIdentities, TopologicalSort
from passes.defaults import default_passes
from passes.folding import FoldConstants
from passes.lowering import LowerCustomOps
from passes.onnx_io import module_path, to_graph, to_model

__all__ = [
    "FoldConstants",
    "GraphPass",
    "LowerCustomOps",
    "PassManager",
    "PassRecord",
    "PassResult",
    "RemoveDeadNodes",
    "RemoveIdentities",
    "TopologicalSort",
    "default_passes",
    "insert_passes",
    "module_path",
    "to_graph",
    "to_model",
]
