"""``x[mask] = values`` without ``NonZero``: ``ScatterND(x, Transpose(NonZero(mask)), values)`` as a ``Where``.

PyTorch's exporter writes a boolean-mask ``index_put`` (``x[mask] = values``, ``x[mask] += values``) as ``NonZero``
of the mask expanded to ``x``'s shape, transposed into one index tuple per masked element, and a ``ScatterND`` of the
values (broadcast and flattened, one per masked element in row-major order). TensorRT-RTX's parser has no
``NonZero`` (its plugin creator is missing), so that node, and every node whose shape follows from it, ran on ONNX
Runtime: T5Gemma 2's encoder places its end-of-image embedding this way (``embeddings[input_ids == eoi] = eoi``), and
its engine was split in three.

The masked places take the values in row-major order, which is what ``aten::masked_scatter`` does
(:mod:`converters.aten.masked_scatter`): each element's value index is the count of masked elements up to it, less
one (``CumSum`` of the flattened mask); a ``Gather`` of the values (one zero appended, so that no masked element and
no value still gathers) at those indices, kept where the mask is set (``Where``); ``reduction="add"`` adds them to
``x`` there. Exact, with the data's own shapes: no data-dependent output size. Rewritten only when the mask has the
data's shape, or its leading axes' (each index tuple addresses one element, or one block of the trailing axes, which
``x[mask] = rows`` writes); otherwise the node is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import dtype_of
from passes.rules import Facts, RewriteContext, RewriteRule


@dataclass(frozen=True)
class MaskPlan:
    """A scatter of one block of values per masked place: the mask (the data's leading shape), the rank of a block,
    the reduction and the data's type."""

    mask: gs.Tensor
    rest: int  # the data's axes past the mask's: each masked place takes a block of values of that rank
    add: bool
    dtype: np.dtype
    broadcast: gs.Tensor | None  # the value every place takes (broadcast over its block), when the values are one
    gathered: gs.Tensor  # else the values, [places or 1, *block] before the exporter expanded them to the places


class MaskedScatterNDAsWhere(RewriteRule[MaskPlan]):
    """``ScatterND(x, Transpose(NonZero(mask)), values)`` -> ``CumSum`` + ``Gather`` + ``Where`` (module doc)."""

    name = "masked_scatter_nd_as_where"
    ops = frozenset({"ScatterND"})

    def check(self, node: gs.Node, facts: Facts) -> MaskPlan | str:
        """A plan when the indices are the transposed ``NonZero`` of a mask of the data's shape; else the reason."""
        reduction = node.attrs.get("reduction", "none")
        reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
        if reduction not in ("none", "add"):
            return f"reduction {reduction!r}: rewritten for none and add"
        data, indices = node.inputs[0], node.inputs[1]
        transpose = _producer(indices, "Transpose")
        if transpose is None or list(transpose.attrs.get("perm", [1, 0])) != [1, 0]:
            return "the indices are not a transposed NonZero"
        nonzero = _producer(transpose.inputs[0], "NonZero")
        if nonzero is None:
            return "the indices are not a transposed NonZero"
        mask, shape = _place_mask(nonzero.inputs[0]), data.shape
        if mask.shape is None or shape is None or not _same_shape(mask.shape, shape[: len(mask.shape)]):
            return f"the mask's shape {mask.shape} is not known to be the data's leading {shape}"
        dtype = dtype_of(data)
        if dtype is None:
            return "the data's type is unknown"
        rest = len(shape) - len(mask.shape)
        source = _expanded(node.inputs[2])
        rank = None if source is None or source.shape is None else len(source.shape)
        broadcast = source if rank is not None and rank <= rest else None
        gathered = source if rank == rest + 1 else node.inputs[2]
        return MaskPlan(mask, rest, reduction == "add", dtype, broadcast, gathered)

    def rewrite(self, plan: MaskPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Where the mask is set: the one broadcast value, else the values gathered at each place's rank among the
        masked ones."""
        data = ctx.node.inputs[0]
        op, ints, flat = ctx.typed(plan.dtype), ctx.typed(np.int64), np.array([-1], np.int64)
        mask = plan.mask
        if dtype_of(mask) != np.dtype(np.bool_):
            mask = ctx.typed(np.bool_).Cast(mask, to=onnx.TensorProto.BOOL)  # NonZero: the elements that are not 0
        if plan.broadcast is not None:  # every place takes the same block: no gather, no count of the places
            rank = len(plan.mask.shape or ())
            trailing = ctx.constant(np.arange(rank, rank + plan.rest, dtype=np.int64), "block_axes")
            placed = ctx.typed(np.bool_).Unsqueeze(mask, trailing) if plan.rest else mask
            value = op.Add(data, plan.broadcast) if plan.add else plan.broadcast
            return [op.Where(placed, value, data)]
        flat_mask = ctx.typed(np.bool_).Reshape(mask, flat)
        counted = ints.CumSum(ints.Cast(flat_mask, to=onnx.TensorProto.INT64), ctx.constant(np.array(0, np.int64)))
        index = ints.Max(ints.Sub(counted, ctx.constant(np.array(1, np.int64))), ctx.constant(np.array(0, np.int64)))
        rank = len(data.shape or ())
        block = ints.Slice(ints.Shape(data), ctx.constant(np.array([rank - plan.rest], np.int64), "block_start"),
                           ctx.constant(np.array([rank], np.int64), "block_end"))  # fmt: skip
        rows = ints.Concat(ctx.constant(flat, "rows"), block, axis=0)  # [places, *block]
        # one block of zeros past the values: no masked place and no values still gathers
        past = ctx.constant(np.array([0] * (plan.rest + 1) + [1] + [0] * plan.rest, np.int64), "past_the_values")
        source = op.Reshape(plan.gathered, rows)
        # the values' first axis holds one row per masked place, or one row for all of them (then row 0 for all)
        last = ints.Sub(ints.Slice(ints.Shape(source), *(ctx.constant(np.array([i], np.int64)) for i in (0, 1))),
                        ctx.constant(np.array([1], np.int64)))  # fmt: skip
        index = ints.Min(index, ints.Max(last, ctx.constant(np.array([0], np.int64))))
        padded = op.Pad(source, past, mode="constant")
        picked = op.Gather(padded, index, axis=0)
        base = op.Reshape(data, rows)
        if plan.add:
            picked = op.Add(base, picked)
        kept = ctx.typed(np.bool_).Reshape(flat_mask, ctx.constant(np.array([-1] + [1] * plan.rest, np.int64)))
        return [op.Reshape(op.Where(kept, picked, base), ints.Shape(data))]


def _place_mask(mask: gs.Tensor) -> gs.Tensor:
    """The mask of places: ``mask`` itself, or, when it is a mask of fewer axes unsqueezed at the end and expanded
    (the exporter's element mask for ``x[rows] = v``), that mask of fewer axes."""
    expand = _producer(mask, "Expand")
    unsqueeze = _producer(expand.inputs[0], "Unsqueeze") if expand is not None else None
    if unsqueeze is None or len(unsqueeze.inputs) < 2 or unsqueeze.inputs[0].shape is None:
        return mask
    axes = getattr(unsqueeze.inputs[1], "values", None)
    rank = len(unsqueeze.inputs[0].shape)
    total = rank + (0 if axes is None else int(np.size(axes)))
    if axes is None or sorted(int(a) % total for a in np.ravel(axes)) != list(range(rank, total)):
        return mask
    return unsqueeze.inputs[0]


def _expanded(values: gs.Tensor) -> gs.Tensor | None:
    """The tensor the exporter expanded to one block per masked place (and flattened) to make ``values``: it expands
    ``v`` of ``x[mask] = v`` to the count of masked places, a shape computed from the mask's values, which TensorRT
    then reads as a shape input. None when ``values`` is not an ``Expand`` (or its flattening)."""
    reshape = _producer(values, "Reshape")
    expand = _producer(reshape.inputs[0] if reshape is not None else values, "Expand")
    return None if expand is None else expand.inputs[0]


def _producer(tensor: gs.Tensor, op: str) -> gs.Node | None:
    node = tensor.inputs[0] if tensor.inputs else None
    return node if node is not None and node.op == op else None


def _same_shape(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Are both shapes known and equal, dimension by dimension (equal sizes, or one symbolic name)?"""
    if len(a) != len(b):
        return False
    return all(x == y and x is not None and not (isinstance(x, int) and x < 0) for x, y in zip(a, b, strict=True))
