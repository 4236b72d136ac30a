"""Built-in converters for ``aten::amax``/``aten::amin``: the exporter fails on their default ``dim=[]`` (reduce over
every axis: "Required parameter 'dim' is not provided"), which ``torch.amax(x)`` and the masked reductions use."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry


class _Reduce(torch.nn.Module):
    def __init__(self, function: object, dim: tuple[int, ...] = (), keepdim: bool = False) -> None:
        super().__init__()
        self.function, self.dim, self.keepdim = function, dim, keepdim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x, dim=self.dim, keepdim=self.keepdim)  # type: ignore[operator]


def _reduce(ctx: ConverterContext, op_type: str) -> gs.Tensor:
    x = ctx.inputs[0]
    dims = [int(d) for d in (ctx.attrs.get("dim") or ())]
    keepdims = int(bool(ctx.attrs.get("keepdim")))
    if len(ctx.input_shapes[0] or ()) == 0:  # a 0-d tensor reduces to itself
        return ctx.op.Identity(x)
    reduce = getattr(ctx.op, op_type)
    if not dims:
        return reduce(x, keepdims=keepdims)
    return reduce(x, ctx.constant(np.array(dims, np.int64)), keepdims=keepdims)


@converter_case(lambda: _Reduce(torch.amax), inputs=[((3, 5), "float32")])
@converter_case(lambda: _Reduce(torch.amax, (0, 2), keepdim=True), inputs=[((2, 3, 4), "float32")])
@converter_case(lambda: _Reduce(torch.amax, (-1,)), inputs=[((2, 6), "float32")], dynamic={"x": {0: ("b", 1, 2, 4)}})
def convert_amax(ctx: ConverterContext) -> gs.Tensor:
    """``aten::amax``: ``ReduceMax`` over ``dim``, or over every axis when ``dim`` is empty (its default)."""
    return _reduce(ctx, "ReduceMax")


@converter_case(lambda: _Reduce(torch.amin), inputs=[((3, 5), "float32")])
@converter_case(lambda: _Reduce(torch.amin, (1,), keepdim=True), inputs=[((2, 3, 4), "float32")])
def convert_amin(ctx: ConverterContext) -> gs.Tensor:
    """``aten::amin``: ``ReduceMin`` over ``dim``, or over every axis when ``dim`` is empty (its default)."""
    return _reduce(ctx, "ReduceMin")


def register_reduction_converters(registry: ConverterRegistry) -> None:
    """Register the ``amax``/``amin`` converters on ``registry``."""
    registry.register("aten::amax.default")(convert_amax)
    registry.register("aten::amin.default")(convert_amin)
