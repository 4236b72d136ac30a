"""``aten::sort`` (``sort``, ``argsort``, ``msort``): a stable sort by ranks where ``TopK``'s order of ties is not
PyTorch's, chunked ``TopK`` merged by binary search where one ``TopK`` cannot build, ``TopK`` elsewhere.

The exporter writes every sort as one ``TopK`` with ``k`` = the axis length. That has two limits:

- TensorRT-RTX refuses ``TopK`` with ``k`` above 3840 ("K exceeds the maximum value allowed"), so a long axis does
  not build;
- the order of tied values is unspecified, where PyTorch's is stable for ``stable=True`` and, for its default
  (unstable) sort on the CPU, for axes of up to 16 elements (insertion sort: measured equal to the stable order on
  tied inputs; above 16 PyTorch's introsort order of ties follows no rule a graph can reproduce, and differs from
  its own ``stable=True`` order).

Three constructions, chosen by :func:`sort_method`:

- ``"ranks"`` (``stable=True``, or an axis of at most 16): ``rank_i = #{j: v_j before v_i} + #{j < i: v_j tied
  with v_i}`` (NaN after every number ascending, before descending, NaNs tied, as PyTorch orders them), then each
  value and index scattered to its rank. Exact and stable for every input; an ``n x n`` comparison per slice, so
  only up to :data:`MAX_RANK_PAIRS` pairs in all (8000 values: 64 million pairs, 256 MB of int32 counts).
- ``"chunks"`` (an axis above 3840 otherwise): ``TopK`` per chunk of at most 3840, then each element's rank = its
  place in its chunk + how many elements of every other chunk sort before it (ties: the earlier chunk first),
  counted by a binary search (12 ``GatherElements`` steps per pair of chunks): O(n log n), builds for any length.
  Values exact; ties keep chunk order but ``TopK``'s order inside a chunk; NaN sorts as +inf (with +inf in the same
  slice, their order among themselves is ``TopK``'s).
- ``"topk"`` (16 < n <= 3840 unstable, or a dynamic length): ``TopK`` as the exporter writes it.

Values are exact in all three; the indices of ties may differ from PyTorch's unstable order above 16 elements, as
no graph can reproduce it. With ``precision`` fp16/bf16, always ``"topk"``: the precision stage types each node on
its own, and comparisons of one sort made in two types can disagree (measured: duplicate ranks, wrong values);
``TopK``'s output is a permutation in any type (above 3840 TensorRT-RTX then refuses it: a build error).
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


def sort_method(length: int | str | None, slices: int | None, stable: bool) -> str:
    """How a sort of ``slices`` slices of ``length`` is built: ``"ranks"``, ``"chunks"`` or ``"topk"`` (module
    doc)."""
    if not isinstance(length, int):
        return "topk"
    small = slices is not None and slices * length * length <= MAX_RANK_PAIRS
    if small and (stable or length <= STABLE_IN_PRACTICE):
        return "ranks"
    return "chunks" if length > TOPK_MAX else "topk"


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


def _count_before(
    ctx: ConverterContext, keys: gs.Tensor, length: int, probe: gs.Tensor, descending: bool, inclusive: bool
) -> gs.Tensor:
    """How many of ``keys`` (sorted along the last axis, ``length`` of them) sort before each of ``probe`` (or tie
    with it, ``inclusive``): a binary search of ``ceil(log2(length + 1))`` GatherElements steps."""
    low = ctx.op.Expand(np.array(0, np.int64), ctx.op.Shape(probe))
    high = ctx.op.Expand(np.array(length, np.int64), ctx.op.Shape(probe))
    compare = ctx.op.Greater if descending else ctx.op.Less
    for _ in range(math.ceil(math.log2(length + 1))):
        middle = ctx.op.Div(ctx.op.Add(low, high), np.array(2, np.int64))
        seen = ctx.op.GatherElements(keys, ctx.op.Min(middle, np.array(length - 1, np.int64)), axis=-1)
        goes_before = compare(seen, probe)
        if inclusive:
            goes_before = ctx.op.Or(goes_before, ctx.op.Equal(seen, probe))
        goes_before = ctx.op.And(goes_before, ctx.op.Less(middle, high))
        low = ctx.op.Where(goes_before, ctx.op.Add(middle, np.array(1, np.int64)), low)
        high = ctx.op.Where(goes_before, high, middle)
    return low


def _chunked_sort(ctx: ConverterContext, x: gs.Tensor, length: int, descending: bool) -> list[gs.Tensor]:
    """Values and int64 indices of ``x`` sorted along its last axis (``length`` > TOPK_MAX): ``TopK`` per chunk of
    at most TOPK_MAX, then each element's rank = its place in its chunk + how many of every other chunk sort before
    it (ties: the earlier chunk first), found by binary search; scattered to those ranks. NaN sorts as +inf (its
    order among +inf values is TopK's)."""
    floating = np.dtype(ctx.input_dtypes[0] or np.float32).kind == "f"
    keys = ctx.op.Where(ctx.op.IsNaN(x), np.array(np.inf, ctx.input_dtypes[0]), x) if floating else x
    chunks = []
    for start in range(0, length, TOPK_MAX):
        size = min(TOPK_MAX, length - start)
        piece = ctx.op.Slice(keys, _ints([start]), _ints([start + size]), _ints([-1]))
        sorted_keys, local = ctx.op.TopK(piece, _ints([size]), axis=-1, largest=int(descending), sorted=1, outputs=2)
        chunks.append((size, sorted_keys, ctx.op.Add(local, np.array(start, np.int64))))
    ranks, indices = [], []
    for c, (size, sorted_keys, index) in enumerate(chunks):
        rank = ctx.op.Expand(np.arange(size, dtype=np.int64), ctx.op.Shape(index))
        for d, (other_size, other_keys, _) in enumerate(chunks):
            if d != c:
                counted = _count_before(ctx, other_keys, other_size, sorted_keys, descending, inclusive=d < c)
                rank = ctx.op.Add(rank, counted)
        ranks.append(rank)
        indices.append(index)
    rank_all = ctx.op.Concat(*ranks, axis=-1)
    index_all = ctx.op.Concat(*indices, axis=-1)
    values = ctx.op.ScatterElements(x, rank_all, ctx.op.GatherElements(x, index_all, axis=-1), axis=-1)
    return [values, ctx.op.ScatterElements(index_all, rank_all, index_all, axis=-1)]


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
    method = sort_method(length, slices, bool(ctx.attrs.get("stable")))
    if ctx.settings.precision != "fp32":
        # the precision stage picks each node's type on its own: comparisons of one sort in two types can disagree
        # and break the permutation. TopK's output is a permutation in any type (past 3840: a build error)
        method = "topk"
    if method == "topk":
        return _topk(ctx, x, axis, descending)
    perm = [a for a in range(rank) if a != axis] + [axis]
    moved = x if axis == rank - 1 else ctx.op.Transpose(x, perm=perm)
    sort = _rank_sort if method == "ranks" else _chunked_sort
    outputs = sort(ctx, moved, int(length), descending)
    if axis == rank - 1:
        return outputs
    back = [int(a) for a in np.argsort(perm)]
    return [ctx.op.Transpose(t, perm=back) for t in outputs]


def register_sort_converters(registry: ConverterRegistry) -> None:
    """``aten::sort`` in both overloads (``torch.sort``, ``argsort`` and ``msort`` export as it)."""
    registry.register("aten::sort.default")(convert_sort)
    registry.register("aten::sort.stable")(convert_sort)
