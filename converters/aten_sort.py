"""``aten::sort`` (``sort``, ``argsort``, ``msort``): a stable sort by ranks where ``TopK`` cannot be exact or
cannot build, ``TopK`` elsewhere.

The exporter writes every sort as one ``TopK`` with ``k`` = the axis length. That has two limits:

- TensorRT-RTX refuses ``TopK`` with ``k`` above 3840 ("K exceeds the maximum value allowed"), so a long axis does
  not build;
- the order of tied values is unspecified, where PyTorch's is stable for ``stable=True`` and, for its default
  (unstable) sort on the CPU, for axes of up to 16 elements (insertion sort: measured equal to the stable order on
  tied inputs; above 16 PyTorch's introsort order of ties follows no rule a graph can reproduce).

Where the order of ties is PyTorch's stable one (``stable=True``, or an axis of at most 16) or ``TopK`` cannot build
(an axis above 3840), the converter sorts by ranks: ``rank_i = #{j: v_j before v_i} + #{j < i: v_j tied with v_i}``
(NaN after every number ascending, before descending, NaNs tied with each other, as PyTorch orders them), then
scatters each value and its index to its rank. Exact for every input and stable; its cost is an ``n x n`` comparison
per sorted slice (``n`` the axis length), so it is taken only up to :data:`MAX_RANK_PAIRS` pairs in all: 8000 values
compare 64 million pairs (256 MB of int32 counts on the way). Above that, or for a dynamic axis length, ``TopK`` as
the exporter writes it (which TensorRT-RTX builds up to k = 3840). Values are exact either way; only the indices of
ties may differ from PyTorch's unstable order above 16 elements, as they would between two PyTorch builds.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry

#: TensorRT-RTX's largest TopK k.
TOPK_MAX = 3840
#: PyTorch's unstable CPU sort orders ties stably up to this axis length (insertion sort).
STABLE_IN_PRACTICE = 16
#: The most comparisons the rank sort builds (all slices together): 2^28, one GB of int32 counts at most.
MAX_RANK_PAIRS = 1 << 28


def _ints(values: list[int]) -> np.ndarray:
    return np.array(values, np.int64)


def uses_ranks(length: int | str | None, slices: int | None, stable: bool) -> bool:
    """Whether a sort of ``slices`` slices of ``length`` takes the rank sort (module doc) rather than ``TopK``."""
    if not isinstance(length, int) or slices is None or slices * length * length > MAX_RANK_PAIRS:
        return False
    return stable or length <= STABLE_IN_PRACTICE or length > TOPK_MAX


def _order_before(ctx: ConverterContext, vj: gs.Tensor, vi: gs.Tensor, descending: bool) -> gs.Tensor:
    """``v_j`` sorts before ``v_i`` (strictly): NaN is the largest value, as in PyTorch."""
    nan_i, nan_j = ctx.op.IsNaN(vi), ctx.op.IsNaN(vj)
    if descending:
        return ctx.op.Or(ctx.op.Greater(vj, vi), ctx.op.And(nan_j, ctx.op.Not(nan_i)))
    return ctx.op.Or(ctx.op.Less(vj, vi), ctx.op.And(nan_i, ctx.op.Not(nan_j)))


def _rank_sort(ctx: ConverterContext, x: gs.Tensor, length: int, descending: bool) -> list[gs.Tensor]:
    """Values and int64 indices of ``x`` sorted stably along its last axis (module doc)."""
    vi = ctx.op.Unsqueeze(x, _ints([-1]))  # [..., n(i), 1]
    vj = ctx.op.Unsqueeze(x, _ints([-2]))  # [..., 1, n(j)]
    floating = np.dtype(ctx.input_dtypes[0] or np.float32).kind == "f"
    if floating:
        before = _order_before(ctx, vj, vi, descending)
        tied = ctx.op.Or(ctx.op.Equal(vj, vi), ctx.op.And(ctx.op.IsNaN(vj), ctx.op.IsNaN(vi)))
    else:
        before = ctx.op.Greater(vj, vi) if descending else ctx.op.Less(vj, vi)
        tied = ctx.op.Equal(vj, vi)
    positions = ctx.op.Range(np.array(0, np.int64), np.array(length, np.int64), np.array(1, np.int64))
    earlier = ctx.op.Less(ctx.op.Unsqueeze(positions, _ints([0])), ctx.op.Unsqueeze(positions, _ints([1])))  # j < i
    counted = ctx.op.Or(before, ctx.op.And(tied, earlier))
    ranks = ctx.op.ReduceSum(ctx.op.Cast(counted, to=onnx.TensorProto.INT32), _ints([-1]), keepdims=0)
    ranks = ctx.op.Cast(ranks, to=onnx.TensorProto.INT64)
    index = ctx.op.Expand(positions, ctx.op.Shape(x))
    values = ctx.op.ScatterElements(x, ranks, x, axis=-1)
    indices = ctx.op.ScatterElements(index, ranks, index, axis=-1)
    return [values, indices]


def _topk(ctx: ConverterContext, x: gs.Tensor, axis: int, descending: bool) -> list[gs.Tensor]:
    """``TopK`` with ``k`` = the axis length, as the exporter writes a sort."""
    k = ctx.op.Gather(ctx.op.Shape(x), _ints([axis]))
    values, indices = ctx.op.TopK(x, k, axis=axis, largest=int(descending), sorted=1, outputs=2)
    return [values, indices]


class _Sort(torch.nn.Module):
    def __init__(self, dim: int, descending: bool, stable: bool | None) -> None:
        super().__init__()
        self.dim, self.descending, self.stable = dim, descending, stable

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.round(x * 2.0)  # ties, for the order of indices to be tested (NaN: tests/converters/test_aten_sort)
        if self.stable is None:
            values, indices = torch.sort(x, dim=self.dim, descending=self.descending)
        else:
            values, indices = torch.sort(x, dim=self.dim, descending=self.descending, stable=self.stable)
        return values, indices


@converter_case(lambda: _Sort(1, False, True), inputs=[((3, 40), "float32")], name="stable")
@converter_case(lambda: _Sort(0, True, None), inputs=[((12, 5), "float32")], name="short_descending")
def convert_sort(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::sort.default`` / ``aten::sort.stable``: values and int64 indices along ``dim`` (module doc)."""
    x = ctx.inputs[0]
    shape = ctx.input_shapes[0] or ()
    if len(shape) == 0:
        return [ctx.op.Identity(x), ctx.constant(np.array(0, np.int64))]
    rank = len(shape)
    axis = int(ctx.attrs.get("dim", -1)) % rank
    descending = bool(ctx.attrs.get("descending", False))
    length = shape[axis]
    others = [d for a, d in enumerate(shape) if a != axis]
    slices = math.prod(int(d) for d in others) if all(isinstance(d, int) for d in others) else None
    if not uses_ranks(length, slices, bool(ctx.attrs.get("stable"))):
        return _topk(ctx, x, axis, descending)
    perm = [a for a in range(rank) if a != axis] + [axis]
    moved = x if axis == rank - 1 else ctx.op.Transpose(x, perm=perm)
    outputs = _rank_sort(ctx, moved, int(length), descending)
    if axis == rank - 1:
        return outputs
    back = [int(a) for a in np.argsort(perm)]
    return [ctx.op.Transpose(t, perm=back) for t in outputs]


def register_sort_converters(registry: ConverterRegistry) -> None:
    """``aten::sort`` in both overloads (``torch.sort``, ``argsort`` and ``msort`` export as it)."""
    registry.register("aten::sort.default")(convert_sort)
    registry.register("aten::sort.stable")(convert_sort)
