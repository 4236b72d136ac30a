"""Rewrites of ONNX ops TensorRT's parser rejects into ops it accepts, where shapes allow, and Reduce axes moved
into initializers (the parser reads them from nowhere else).

Each pass leaves a node it cannot rewrite exactly as it is, and ``check(node, graph)`` returns the reason; the
static compatibility check reports such nodes.
"""

from __future__ import annotations

from passes.base import GraphPass
from passes.parser_fixes.bitwise import BitwiseToArithmetic
from passes.parser_fixes.col2im import Col2ImToGather
from passes.parser_fixes.dft import DftToMatMul
from passes.parser_fixes.image import AffineGridToMatMul, CenterCropPadToSlicePad
from passes.parser_fixes.indexing import CompressToGather, MaxUnpoolToScatter
from passes.parser_fixes.reduce_axes import ReduceAxesToInitializers

__all__ = [
    "AffineGridToMatMul",
    "BitwiseToArithmetic",
    "CenterCropPadToSlicePad",
    "Col2ImToGather",
    "CompressToGather",
    "DftToMatMul",
    "MaxUnpoolToScatter",
    "ReduceAxesToInitializers",
    "parser_fix_passes",
]


def parser_fix_passes() -> tuple[GraphPass, ...]:
    """The rewrites, in the order the default list runs them (after constant folding): the op rewrites, then Reduce
    axes into initializers, which also covers axes the folding could not compute (it stops at the first error)."""
    return (
        DftToMatMul(),
        BitwiseToArithmetic(),
        CenterCropPadToSlicePad(),
        Col2ImToGather(),
        AffineGridToMatMul(),
        MaxUnpoolToScatter(),
        CompressToGather(),
        ReduceAxesToInitializers(),
    )
