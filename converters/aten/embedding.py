"""``embedding_bag`` without ONNX sequence ops.

The exporter translates ``aten::embedding_bag`` / ``_embedding_bag`` into a ``Loop`` over the bags that collects
rows in a sequence (``SequenceEmpty``, ``SequenceInsert``, ``ConcatFromSequence``), which TensorRT's parser
rejects. Offsets are data, so the bags cannot be unrolled at conversion time; instead every bag is compared with
every index position: ``inside[b, j] = offsets[b] <= j < end[b]`` (and ``indices[j] != padding_idx``), the
gathered rows are spread over the bags with ``Where`` (the reduction's identity outside) and reduced over the
positions. Exact (each bag reduces its own rows only: no 0 x inf leaking between bags), at the cost of a
``bags x indices x embedding_dim`` temporary.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch
import torch.nn.functional as F

from converters.cases import converter_case
from converters.context import ConverterContext
from converters.errors import ConversionError
from converters.registry import ConverterRegistry

_SUM, _MEAN, _MAX = 0, 1, 2
_MODES = {"sum": _SUM, "mean": _MEAN, "max": _MAX}
_INT64_MAX = np.iinfo(np.int64).max


def _ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


class _EmbeddingBag(torch.nn.Module):
    """``F.embedding_bag`` of a fixed 10-row table. With ``offsets`` given they are a buffer and ``forward`` takes
    (indices[, per_sample_weights]) (random integer inputs in [0, 10) are valid indices); without, ``forward``
    takes (indices, offsets[, per_sample_weights])."""

    def __init__(self, offsets: list[int] | None = None, **options: Any) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-2.0, 3.0, 10 * 4).reshape(10, 4))
        self.offsets: torch.Tensor | None
        self.register_buffer("offsets", None if offsets is None else torch.tensor(offsets))
        self.options = options

    def forward(self, indices: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
        """The bags of ``indices``."""
        if self.offsets is not None:
            more = (self.offsets, *more)
        psw = more[1] if len(more) > 1 else None
        return F.embedding_bag(indices, self.weight, more[0], per_sample_weights=psw, **self.options)


def embedding_bag_supported(node: gs.Node, settings: object) -> bool:
    """A mode PyTorch defines (sum, mean, max) on 1-D indices and offsets (``F.embedding_bag`` flattens 2-D
    indices into this form before the ATen op)."""
    mode = node.attrs.get("mode", _SUM)
    ranks = [None if t.shape is None else len(t.shape) for t in node.inputs[1:3] if t is not None and t.name]
    return int(mode) in _MODES.values() and all(r in (None, 1) for r in ranks)


@converter_case(lambda: _EmbeddingBag([0, 2, 5], mode="mean", padding_idx=2), inputs=[((7,), "int64")])
@converter_case(lambda: _EmbeddingBag([0, 0, 4], mode="max"), inputs=[((7,), "int64")])
@converter_case(
    lambda: _EmbeddingBag([0, 1, 4, 7], mode="sum", include_last_offset=True),
    inputs=[((7,), "int64"), ((7,), "float32")],
)
def convert_embedding_bag(ctx: ConverterContext) -> list[gs.Tensor]:
    """``aten::embedding_bag`` / ``_embedding_bag`` (sum, mean, max; ``per_sample_weights``,
    ``include_last_offset``, ``padding_idx``; an empty bag gives zeros): see the module docstring. With
    ``include_last_offset`` the last offset should be the number of indices (PyTorch's contract); when it is not,
    this does what PyTorch's CPU kernels do: sum stops at it, mean divides that sum by the count to the end of the
    indices, max runs to the end; with a ``padding_idx`` all three run to the end. Only the
    first output (the bags) is computed; ``offset2bag``, ``bag_size`` and ``max_indices`` (autograd's
    bookkeeping) must be unused, else a ConversionError."""
    _check_bookkeeping_unused(ctx)
    weight, indices, offsets, psw = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], ctx.input("per_sample_weights")
    dtype = np.dtype(ctx.input_dtypes[0] or np.float32)
    mode = int(ctx.attrs.get("mode", _SUM))
    indices = ctx.op.Cast(indices, to=onnx.TensorProto.INT64)
    offsets = ctx.op.Cast(offsets, to=onnx.TensorProto.INT64)
    last_offset = bool(ctx.attrs.get("include_last_offset"))
    kept = _kept(ctx, indices)
    inside = _membership(ctx, indices, offsets, last_offset, kept)  # [B, N]
    # PyTorch's last bag with include_last_offset when the last offset is not the number of indices (its contract):
    # sum stops at the last offset, mean counts to the end of the indices and max runs there; with a padding_idx,
    # all of them run to the end
    to_end = _membership(ctx, indices, offsets, last_offset, kept, to_end=True) if last_offset else inside
    inside = to_end if kept is not None else inside
    rows = ctx.op.Gather(weight, indices, axis=0)  # [N, D]
    if psw is not None:
        rows = ctx.op.Mul(rows, ctx.op.Unsqueeze(psw, ctx.constant(_ints(1))))
    over_positions = ctx.constant(_ints(1))
    spread_rows = ctx.op.Unsqueeze(rows, ctx.constant(_ints(0)))  # [1, N, D]
    zero = ctx.constant(np.array(0, dtype))
    count = ctx.op.ReduceSum(ctx.op.Cast(to_end, to=onnx.helper.np_dtype_to_tensor_dtype(dtype)), over_positions)
    if mode == _MAX:
        lowest = ctx.constant(np.array(-np.inf, dtype))
        spread = ctx.op.Where(ctx.op.Unsqueeze(to_end, ctx.constant(_ints(2))), spread_rows, lowest)  # [B, N, D]
        reduced = ctx.op.ReduceMax(spread, over_positions, keepdims=0)
        bags = ctx.op.Where(ctx.op.Greater(count, zero), reduced, zero)  # an empty bag is zeros, as in PyTorch
    else:
        spread = ctx.op.Where(ctx.op.Unsqueeze(inside, ctx.constant(_ints(2))), spread_rows, zero)
        bags = ctx.op.ReduceSum(spread, over_positions, keepdims=0)
        if mode == _MEAN:
            bags = ctx.op.Div(bags, ctx.op.Max(count, ctx.constant(np.array(1, dtype))))
    return [bags, *(_placeholder(ctx, i) for i in range(1, len(ctx.node.outputs)))]


def _kept(ctx: ConverterContext, indices: gs.Tensor) -> gs.Tensor | None:
    """``[1, N]`` bool: the index is not ``padding_idx``; None without one (F.embedding_bag passes -1 for none)."""
    padding = ctx.attrs.get("padding_idx")
    if padding is None or int(padding) < 0:
        return None
    kept = ctx.op.Not(ctx.op.Equal(indices, ctx.constant(np.array(int(padding), np.int64))))
    return ctx.op.Unsqueeze(kept, ctx.constant(_ints(0)))


def _membership(
    ctx: ConverterContext,
    indices: gs.Tensor,
    offsets: gs.Tensor,
    last_offset: bool,
    kept: gs.Tensor | None,
    to_end: bool = False,
) -> gs.Tensor:
    """``inside[b, j]``: index position j belongs to bag b (``starts[b] <= j < ends[b]``, and is ``kept``), bool
    ``[B, N]``. With ``last_offset`` (B + 1 offsets) the last offset closes the last bag, or with ``to_end``
    the end of the indices does; without, the last bag runs to the end of the indices."""
    size = ctx.op.Shape(indices)  # [N]
    following = ctx.op.Slice(offsets, ctx.constant(_ints(1)), ctx.constant(_ints(_INT64_MAX)))
    starts, ends = offsets, ctx.op.Concat(following, size, axis=0)
    if last_offset:
        starts = ctx.op.Slice(offsets, ctx.constant(_ints(0)), ctx.constant(_ints(-1)))
        inner = ctx.op.Slice(offsets, ctx.constant(_ints(1)), ctx.constant(_ints(-1)))
        ends = ctx.op.Concat(inner, size, axis=0) if to_end else following
    positions = ctx.op.Range(
        ctx.constant(np.array(0, np.int64)),
        ctx.op.Squeeze(size, ctx.constant(_ints(0))),
        ctx.constant(np.array(1, np.int64)),
    )
    row = ctx.op.Unsqueeze(positions, ctx.constant(_ints(0)))  # [1, N]
    column = ctx.constant(_ints(1))
    after_start = ctx.op.GreaterOrEqual(row, ctx.op.Unsqueeze(starts, column))
    inside = ctx.op.And(after_start, ctx.op.Less(row, ctx.op.Unsqueeze(ends, column)))
    return inside if kept is None else ctx.op.And(inside, kept)


def _check_bookkeeping_unused(ctx: ConverterContext) -> None:
    """``offset2bag``, ``bag_size`` and ``max_indices`` are not computed: none of them may be read."""
    graph_outputs = {id(t) for t in ctx.graph.outputs}
    used = [i for i, t in enumerate(ctx.node.outputs[1:], 1) if t.outputs or id(t) in graph_outputs]
    if used:
        raise ConversionError(
            f"{ctx.key}: outputs {used} (offset2bag, bag_size, max_indices) are used, and only the bags (output 0) "
            "are converted",
            node=ctx.name,
            fix="use only the first result of embedding_bag (what F.embedding_bag and nn.EmbeddingBag return)",
        )


def _placeholder(ctx: ConverterContext, index: int) -> gs.Tensor:
    """An empty int64 tensor of the output's rank for an unused bookkeeping output (removed as unused)."""
    shape = ctx.node.outputs[index].shape
    rank = 1 if shape is None else len(shape)
    return ctx.constant(np.zeros((0,) * rank, np.int64), name=f"unused_{index}")


def register_embedding_converters(registry: ConverterRegistry) -> None:
    """Register the ``embedding_bag`` converter for every form of the op, one call each."""
    registry.register("aten::embedding_bag.default", validator=embedding_bag_supported)(convert_embedding_bag)
    registry.register("aten::embedding_bag.padding_idx", validator=embedding_bag_supported)(convert_embedding_bag)
    registry.register("aten::_embedding_bag.default", validator=embedding_bag_supported)(convert_embedding_bag)
