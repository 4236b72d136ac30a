"""Rewrites of ONNX ops TensorRT's parser rejects into ops it accepts, where shapes allow, and Reduce axes moved
into initializers (the parser reads them from nowhere else).

Each fix is a :class:`passes.rules.RewriteRule` (and the pass that runs it alone). A fix leaves a node it cannot
rewrite exactly as it is, and ``check(node, facts)`` returns the reason; :func:`declined_fixes` collects those
reasons for the static compatibility check, which shows them next to each node the parser rejects.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx_graphsurgeon as gs

from passes.parser_fixes.average_pool import OversizedAveragePoolToGlobal
from passes.parser_fixes.bitwise import BitwiseToArithmetic
from passes.parser_fixes.boolean_where import BooleanWhereAsLogic
from passes.parser_fixes.col2im import Col2ImToGather
from passes.parser_fixes.dft import DftToMatMul
from passes.parser_fixes.edge_pad import NegativeEdgePadToGather
from passes.parser_fixes.einsum import EinsumEquationForParser
from passes.parser_fixes.image import AffineGridToMatMul, CenterCropPadToSlicePad
from passes.parser_fixes.indexing import CompressToGather, MaxUnpoolToScatter
from passes.parser_fixes.losses import ClassLossToGather
from passes.parser_fixes.low_rank import LiftLowRank
from passes.parser_fixes.masked_scatter import MaskedScatterNDAsWhere
from passes.parser_fixes.max_pool import MaxPoolByWindows
from passes.parser_fixes.mixed_types import MixedTypeArithmetic
from passes.parser_fixes.normalization import LayerNormStatistics
from passes.parser_fixes.random import BernoulliAsUniform
from passes.parser_fixes.reduce_axes import ReduceAxesToInitializers
from passes.parser_fixes.scatter_reduce import ScatterReductionToMask
from passes.parser_fixes.uint8_constants import UInt8ConstantOutputsAsCasts
from passes.rules import Facts, RewriteRule

__all__ = [
    "AffineGridToMatMul",
    "BernoulliAsUniform",
    "BitwiseToArithmetic",
    "BooleanWhereAsLogic",
    "CenterCropPadToSlicePad",
    "ClassLossToGather",
    "Col2ImToGather",
    "CompressToGather",
    "DftToMatMul",
    "EinsumEquationForParser",
    "LayerNormStatistics",
    "LiftLowRank",
    "MaskedScatterNDAsWhere",
    "MaxPoolByWindows",
    "MaxUnpoolToScatter",
    "MixedTypeArithmetic",
    "NegativeEdgePadToGather",
    "OversizedAveragePoolToGlobal",
    "ReduceAxesToInitializers",
    "ScatterReductionToMask",
    "UInt8ConstantOutputsAsCasts",
    "declined_fixes",
    "parser_fix_passes",
]


def parser_fix_passes() -> tuple[RewriteRule[Any], ...]:
    """The rewrites, in the order the default list runs them (after constant folding): the op rewrites, then Reduce
    axes into initializers, which also covers axes the folding could not compute (it stops at the first error)."""
    return (
        DftToMatMul(),
        EinsumEquationForParser(),
        BitwiseToArithmetic(),
        CenterCropPadToSlicePad(),
        Col2ImToGather(),
        AffineGridToMatMul(),
        MaxUnpoolToScatter(),
        CompressToGather(),
        ClassLossToGather(),
        LiftLowRank(),
        MaxPoolByWindows(),
        OversizedAveragePoolToGlobal(),
        LayerNormStatistics(),
        MaskedScatterNDAsWhere(),
        ScatterReductionToMask(),
        BernoulliAsUniform(),
        NegativeEdgePadToGather(),
        UInt8ConstantOutputsAsCasts(),
        MixedTypeArithmetic(),
        BooleanWhereAsLogic(),
        ReduceAxesToInitializers(),
    )


def declined_fixes(model: onnx.ModelProto, nodes: set[str]) -> dict[str, list[str]]:
    """For each node of ``model`` named in ``nodes`` that a parser fix looks at: ``"<fix>: <why it declines>"``
    (or that it would rewrite it, when the model has not been through the default pass list)."""
    fixes = parser_fix_passes()
    ops = {op for fix in fixes for op in fix.ops}
    if not any(n.op_type in ops and n.name in nodes for n in model.graph.node):
        return {}
    graph = gs.import_onnx(model)
    facts = Facts(graph)
    found: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.name not in nodes:
            continue
        for fix in fixes:
            if fix.looks_at(node):
                reason = fix.reason(node, facts)
                text = "would rewrite it: run the default pass list" if reason is None else f"declined: {reason}"
                found.setdefault(node.name, []).append(f"parser fix {fix.name!r} {text}")
    return found
