"""ONNX graph passes: the pass API, the pass manager, the rewrite-rule API (:mod:`passes.rules`) and the built-in
passes.

Names load on first use (PEP 562), so that importing one module of the package (``passes.model_io.external_data``, say)
does not import the rest: the runtime reads a few of its modules without the conversion machinery."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

#: public name -> (the module that defines it, its name there)
_LAZY = {
    "GraphPass": ("passes.base", "GraphPass"),
    "PassManager": ("passes.base", "PassManager"),
    "PassResult": ("passes.base", "PassResult"),
    "insert_passes": ("passes.base", "insert_passes"),
    "RemoveDeadNodes": ("passes.cleanup.graph", "RemoveDeadNodes"),
    "RemoveIdentities": ("passes.cleanup.graph", "RemoveIdentities"),
    "TopologicalSort": ("passes.cleanup.graph", "TopologicalSort"),
    "MergeSqueezeChains": ("passes.cleanup.simplify", "MergeSqueezeChains"),
    "RemoveIdentityElements": ("passes.cleanup.simplify", "RemoveIdentityElements"),
    "default_passes": ("passes.defaults", "default_passes"),
    "FoldConstants": ("passes.folding.fold", "FoldConstants"),
    "LowerCustomOps": ("passes.lowering", "LowerCustomOps"),
    "module_path": ("passes.model_io.graphs", "module_path"),
    "to_graph": ("passes.model_io.graphs", "to_graph"),
    "to_model": ("passes.model_io.graphs", "to_model"),
    "AffineGridToMatMul": ("passes.parser_fixes", "AffineGridToMatMul"),
    "BitwiseToArithmetic": ("passes.parser_fixes", "BitwiseToArithmetic"),
    "CenterCropPadToSlicePad": ("passes.parser_fixes", "CenterCropPadToSlicePad"),
    "Col2ImToGather": ("passes.parser_fixes", "Col2ImToGather"),
    "CompressToGather": ("passes.parser_fixes", "CompressToGather"),
    "DftToMatMul": ("passes.parser_fixes", "DftToMatMul"),
    "MaxUnpoolToScatter": ("passes.parser_fixes", "MaxUnpoolToScatter"),
    "ReduceAxesToInitializers": ("passes.parser_fixes", "ReduceAxesToInitializers"),
    "parser_fix_passes": ("passes.parser_fixes", "parser_fix_passes"),
    "PassRecord": ("passes.records", "PassRecord"),
    "Facts": ("passes.rules", "Facts"),
    "RewriteContext": ("passes.rules", "RewriteContext"),
    "RewriteRule": ("passes.rules", "RewriteRule"),
    "RulePass": ("passes.rules", "RulePass"),
    "explain": ("passes.rules", "explain"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
