"""ONNX graph passes: the pass API, the pass manager, the rewrite-rule API (:mod:`passes.rules`) and the built-in
passes."""

from passes.base import GraphPass, PassManager, PassResult, insert_passes
from passes.cleanup.graph import RemoveDeadNodes, RemoveIdentities, TopologicalSort
from passes.cleanup.simplify import MergeSqueezeChains, RemoveIdentityElements
from passes.defaults import default_passes
from passes.folding.fold import FoldConstants
from passes.lowering import LowerCustomOps
from passes.model_io.graphs import module_path, to_graph, to_model
from passes.parser_fixes import (
    AffineGridToMatMul,
    BitwiseToArithmetic,
    CenterCropPadToSlicePad,
    Col2ImToGather,
    CompressToGather,
    DftToMatMul,
    MaxUnpoolToScatter,
    ReduceAxesToInitializers,
    parser_fix_passes,
)
from passes.records import PassRecord
from passes.rules import Facts, RewriteContext, RewriteRule, RulePass, explain

__all__ = [
    "AffineGridToMatMul",
    "BitwiseToArithmetic",
    "CenterCropPadToSlicePad",
    "Col2ImToGather",
    "CompressToGather",
    "DftToMatMul",
    "Facts",
    "FoldConstants",
    "GraphPass",
    "LowerCustomOps",
    "MaxUnpoolToScatter",
    "MergeSqueezeChains",
    "PassManager",
    "PassRecord",
    "PassResult",
    "ReduceAxesToInitializers",
    "RemoveDeadNodes",
    "RemoveIdentityElements",
    "RemoveIdentities",
    "RewriteContext",
    "RewriteRule",
    "RulePass",
    "TopologicalSort",
    "default_passes",
    "explain",
    "insert_passes",
    "module_path",
    "parser_fix_passes",
    "to_graph",
    "to_model",
]
