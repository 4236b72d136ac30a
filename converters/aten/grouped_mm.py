"""Grouped matrix multiplication (mixture-of-experts dispatch) as ops TensorRT builds.

transformers runs its experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, ...) through ``transformers::grouped_mm_fallback``
(a custom op, opaque to the exporter): ``input`` ``[S, K]`` holds the routed tokens sorted
by expert, ``weight`` ``[E, K, N]`` one matrix per expert and ``offs`` ``[E]`` the cumulative token counts, so row
``s`` belongs to expert ``e`` when ``offs[e-1] <= s < offs[e]`` (rows past ``offs[E-1]`` stay zero).

The counts are data, so the groups cannot be sliced at conversion time. The lowering computes each row's expert as
the number of offsets at or below the row index (``GreaterOrEqual`` and a ``ReduceSum``), every expert's product
with one broadcast ``MatMul`` (``[S, K] x [E, K, N] -> [E, S, N]``) and keeps, per row, its own expert's product
(``Where`` over a one-hot mask, then a ``ReduceSum`` of one value and zeros): exact, no division or accumulation
across experts (a non-finite product of another expert never leaks in), at ``E`` times the FLOPs of the grouped
product: the price of a static graph, small next to attention at the expert counts of these models.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.context import ConverterContext
from converters.registry import ConverterRegistry


def _axes(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _arange(ctx: ConverterContext, length_of: gs.Tensor) -> gs.Tensor:
    """``0, 1, ..., n - 1`` (int64) where ``n`` is the first dimension of ``length_of`` (dynamic: read at run time)."""
    first = ctx.op.Gather(ctx.op.Shape(length_of), ctx.constant(_axes(0)))
    count = ctx.op.Squeeze(first, ctx.constant(_axes(0)))
    return ctx.op.Range(ctx.constant(np.int64(0)), count, ctx.constant(np.int64(1)))


def grouped_by_offsets(ctx: ConverterContext, x: gs.Tensor, weight: gs.Tensor, offs: gs.Tensor) -> gs.Tensor:
    """``out[s] = x[s] @ weight[e(s)]`` where ``e(s)`` counts the ``offs`` at or below ``s`` (zero past the last)."""
    op = ctx.op
    dtype = ctx.input_dtypes[0] or np.dtype(np.float32)
    offsets = op.Cast(offs, to=onnx.TensorProto.INT64)
    rows, experts = _arange(ctx, x), _arange(ctx, offsets)  # [S], [E]
    row_column, offset_row = op.Unsqueeze(rows, ctx.constant(_axes(1))), op.Unsqueeze(offsets, ctx.constant(_axes(0)))
    at_or_below = op.GreaterOrEqual(row_column, offset_row)  # [S, E]
    counted = op.Cast(at_or_below, to=onnx.TensorProto.INT64)
    expert = op.ReduceSum(counted, ctx.constant(_axes(1)), keepdims=0)  # [S]: each row's expert (E past the last)
    mine = op.Equal(op.Unsqueeze(experts, ctx.constant(_axes(1))), op.Unsqueeze(expert, ctx.constant(_axes(0))))
    products = op.MatMul(x, weight)  # [S, K] x [E, K, N] -> [E, S, N]
    kept = op.Where(op.Unsqueeze(mine, ctx.constant(_axes(2))), products, ctx.constant(np.zeros((), dtype)))
    return op.ReduceSum(kept, ctx.constant(_axes(0)), keepdims=0)


def convert_grouped_mm_fallback(ctx: ConverterContext) -> gs.Tensor:
    """``transformers::grouped_mm_fallback(input, weight, offs)``: the module doc's lowering."""
    x, weight, offs = ctx.inputs[:3]
    return grouped_by_offsets(ctx, x, weight, offs)


def register_grouped_mm_converters(registry: ConverterRegistry) -> None:
    """Register the grouped matmul converter when its op exists: ``transformers::grouped_mm_fallback`` is defined
    when transformers' mixture-of-experts module is imported, which a model using it has done (the default registry
    is built per conversion)."""
    if hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        registry.register("transformers::grouped_mm_fallback")(convert_grouped_mm_fallback)
