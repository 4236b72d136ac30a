"""Built-in converters: ops the torch exporter has no ONNX translation for, lowered to TensorRT-friendly ops.

Each converter stands with its test cases (``@converter_case``); ``register_builtin_converters`` is the one
explicit list of what the default registry holds.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.aten.antialias import register_antialias_converters
from converters.aten.eigen import register_eigen_converters
from converters.aten.embedding import register_embedding_converters
from converters.aten.grouped_mm import register_grouped_mm_converters
from converters.aten.masked_scatter import register_masked_scatter_converters
from converters.aten.misc import register_misc_converters
from converters.aten.more import register_more_converters
from converters.aten.overrides import register_override_converters
from converters.aten.pointwise import register_aten1_converters
from converters.aten.reductions import register_reduction_converters
from converters.aten.sort import register_sort_converters
from converters.aten.static import register_static_converters
from converters.aten.tensor import register_aten2_converters
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry

_LAST_AXIS = np.array([-1], np.int64)


class _Bucketize(torch.nn.Module):
    def __init__(self, right: bool) -> None:
        super().__init__()
        self.right = right
        self.edges: torch.Tensor
        self.register_buffer("edges", torch.tensor([-1.5, -0.25, 0.0, 0.3, 1.0, 2.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bucketize(x, self.edges, right=self.right)


@converter_case(lambda: _Bucketize(right=False), inputs=[((4, 16), "float32")])
@converter_case(lambda: _Bucketize(right=True), inputs=[((3, 5, 7), "float32")], dynamic={"x": {0: ("batch", 1, 3, 8)}})
def convert_bucketize(ctx: ConverterContext) -> gs.Tensor:
    """``aten::bucketize.Tensor``: the index of each value's bucket = how many boundaries lie below it.

    Compares every value with every boundary (``Less``/``LessOrEqual`` after an ``Unsqueeze``) and counts: no
    data-dependent search, so TensorRT runs it as plain elementwise ops and one reduction.
    """
    values, boundaries = ctx.inputs[0], ctx.inputs[1]
    expanded = ctx.op.Unsqueeze(values, ctx.constant(_LAST_AXIS))
    below = ctx.op.LessOrEqual(boundaries, expanded) if ctx.attrs["right"] else ctx.op.Less(boundaries, expanded)
    out_type = onnx.TensorProto.INT32 if ctx.attrs.get("out_int32") else onnx.TensorProto.INT64
    counts = ctx.op.Cast(below, to=out_type)
    return ctx.op.ReduceSum(counts, ctx.constant(_LAST_AXIS), keepdims=0)


class _Cdist(torch.nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cdist(x, y, p=self.p)


def _valid_p(node: gs.Node, settings: object) -> bool:
    p = float(node.attrs.get("p", 2.0))
    return p >= 0 and not math.isnan(p)


@converter_case(lambda: _Cdist(2.0), inputs=[((2, 6, 8), "float32"), ((2, 5, 8), "float32")])
@converter_case(lambda: _Cdist(1.0), inputs=[((7, 3), "float32"), ((4, 3), "float32")])
@converter_case(lambda: _Cdist(0.0), inputs=[((2, 5, 3), "float32"), ((2, 4, 3), "float32")])
@converter_case(lambda: _Cdist(math.inf), inputs=[((6, 3), "float32"), ((4, 3), "float32")])
@converter_case(
    lambda: _Cdist(3.0),
    inputs=[((2, 6, 4), "float32"), ((2, 5, 4), "float32")],
    dynamic={"x": {0: ("batch", 1, 2, 4)}, "y": {0: ("batch", 1, 2, 4)}},
)
def convert_cdist(ctx: ConverterContext) -> gs.Tensor:
    """``aten::_cdist_forward``: pairwise p-norm distances from the broadcast difference ``x[..., :, None, :] -
    y[..., None, :, :]``. Exact (no ``|x|^2 + |y|^2 - 2xy`` cancellation), at the cost of a P x R x M temporary."""
    x, y = ctx.inputs[0], ctx.inputs[1]
    p = float(ctx.attrs["p"])
    diff = ctx.op.Sub(
        ctx.op.Unsqueeze(x, ctx.constant(np.array([-2], np.int64))),
        ctx.op.Unsqueeze(y, ctx.constant(np.array([-3], np.int64))),
    )
    if p == 0.0:  # how many coordinates differ
        differs = ctx.op.Not(ctx.op.Equal(diff, ctx.constant(np.array(0, ctx.input_dtypes[0] or np.float32))))
        return ctx.op.ReduceSum(ctx.op.CastLike(differs, x), ctx.constant(_LAST_AXIS), keepdims=0)
    if math.isinf(p):
        return ctx.op.ReduceMax(ctx.op.Abs(diff), ctx.constant(_LAST_AXIS), keepdims=0)
    if p == 2.0:
        return ctx.op.Sqrt(ctx.op.ReduceSumSquare(diff, ctx.constant(_LAST_AXIS), keepdims=0))
    if p == 1.0:
        return ctx.op.ReduceSum(ctx.op.Abs(diff), ctx.constant(_LAST_AXIS), keepdims=0)
    powered = ctx.op.Pow(ctx.op.Abs(diff), ctx.constant(np.array(p, np.float32)))
    summed = ctx.op.ReduceSum(powered, ctx.constant(_LAST_AXIS), keepdims=0)
    return ctx.op.Pow(summed, ctx.constant(np.array(1.0 / p, np.float32)))


def register_builtin_converters(registry: ConverterRegistry) -> None:
    """Register every built-in converter on ``registry``, one explicit call each."""
    registry.register("aten::bucketize.Tensor")(convert_bucketize)
    registry.register("aten::_cdist_forward.default", validator=_valid_p)(convert_cdist)
    register_override_converters(registry)
    register_aten1_converters(registry)
    register_aten2_converters(registry)
    register_reduction_converters(registry)
    register_misc_converters(registry)
    register_eigen_converters(registry)
    register_static_converters(registry)
    register_more_converters(registry)
    register_embedding_converters(registry)
    register_sort_converters(registry)
    register_grouped_mm_converters(registry)
    register_masked_scatter_converters(registry)
    register_antialias_converters(registry)
