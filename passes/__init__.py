"""ONNX graph passes: the pass API, the pass manager, the rewrite-rule API (:mod:`passes.rules`) and the built-in
passes.

Names load on first use (PEP 562), so that importing one module of the package (``passes.model_io.external_data``, say)
does not import the rest: the runtime reads a few of its modules without the conversion machinery."""

from __future__ import annotations

from typing import TYPE_CHECKING

from converters.lazy import lazy_names

if TYPE_CHECKING:
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

#: public name -> the module that defines it
_LAZY = {
    "GraphPass": "passes.base",
    "PassManager": "passes.base",
    "PassResult": "passes.base",
    "insert_passes": "passes.base",
    "RemoveDeadNodes": "passes.cleanup.graph",
    "RemoveIdentities": "passes.cleanup.graph",
    "TopologicalSort": "passes.cleanup.graph",
    "MergeSqueezeChains": "passes.cleanup.simplify",
    "RemoveIdentityElements": "passes.cleanup.simplify",
    "default_passes": "passes.defaults",
    "FoldConstants": "passes.folding.fold",
    "LowerCustomOps": "passes.lowering",
    "module_path": "passes.model_io.graphs",
    "to_graph": "passes.model_io.graphs",
    "to_model": "passes.model_io.graphs",
    "AffineGridToMatMul": "passes.parser_fixes",
    "BitwiseToArithmetic": "passes.parser_fixes",
    "CenterCropPadToSlicePad": "passes.parser_fixes",
    "Col2ImToGather": "passes.parser_fixes",
    "CompressToGather": "passes.parser_fixes",
    "DftToMatMul": "passes.parser_fixes",
    "MaxUnpoolToScatter": "passes.parser_fixes",
    "ReduceAxesToInitializers": "passes.parser_fixes",
    "parser_fix_passes": "passes.parser_fixes",
    "PassRecord": "passes.records",
    "Facts": "passes.rules",
    "RewriteContext": "passes.rules",
    "RewriteRule": "passes.rules",
    "RulePass": "passes.rules",
    "explain": "passes.rules",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)

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
