"""``ScatterElements`` and ``ScatterND`` with a ``reduction`` (add, mul, max, min), which TensorRT's parser rejects
("Unsupported reduction type", "ScatterND with reduction is not supported"), as a masked reduction over the
updates. PyTorch writes them for ``scatter_add``, ``scatter_reduce``, ``index_add``, ``index_put(accumulate=True)``
and the backward of max pooling.

Every output element ``j`` reduces the updates whose index is ``j``: a constant ``Range`` compared with the indices
(``Equal``) gives a mask of (output position, update) pairs; ``Where(mask, update, identity)`` then ``ReduceSum``
(``ReduceProd``, ``ReduceMax``, ``ReduceMin``) over the updates gives one value per output position, the identity
(0, 1, the type's lowest, its highest) where no update lands; ``Add`` (``Mul``, ``Max``, ``Min``) with the data
combines them, which leaves untouched positions as they were. Negative indices count from the end, as in ONNX.

- ScatterElements on ``axis``: the mask is ``[..., J, K, ...]`` (J output positions, K updates along the axis); an
  index tensor smaller than the data on other axes leaves the rest of the data as it is (the reduction is padded
  with the identity).
- ScatterND with ``k``-tuples: the tuples become flat positions over the data's first ``k`` axes, the mask is
  ``[M, U]`` (M positions, U tuples) and the reduction ``[M, rest]``.

Max, min and any reduction of integers are exact. Add and mul of several floats landing on the same position are
summed (multiplied) in the reduction's order rather than one by one: equal up to the float rounding of that order.
Needs the data's shape static (the mask's size); the mask is bounded by :data:`MAX_MASK` elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import dtype_of, rank_of, static_shape
from passes.rules import Facts, RewriteContext, RewriteRule

#: The (output position x update) mask holds at most this many elements; a larger scatter is declined.
MAX_MASK = 1 << 24
_REDUCE = {"add": ("ReduceSum", "Add"), "mul": ("ReduceProd", "Mul"), "max": ("ReduceMax", "Max"),
           "min": ("ReduceMin", "Min")}  # fmt: skip
_TYPES = frozenset({"float32", "float16", "int32", "int64"})


@dataclass(frozen=True)
class ScatterPlan:
    """A scatter with a reduction on static data: the reduction, the data's shape and type, and the axis (or k)."""

    reduction: str
    shape: tuple[int, ...]
    dtype: np.dtype
    axis: int  # ScatterElements: the scatter axis; ScatterND: k, the length of an index tuple
    updates_shape: tuple[int, ...] | None  # ScatterElements: the indices' (= updates') static shape


class ScatterReductionToMask(RewriteRule[ScatterPlan]):
    """``ScatterElements``/``ScatterND`` with ``reduction`` -> ``Equal`` mask, ``Where``, ``Reduce*`` and the
    combining op (module doc)."""

    name = "scatter_reduction_to_mask"
    ops = frozenset({"ScatterElements", "ScatterND"})

    def check(self, node: gs.Node, facts: Facts) -> ScatterPlan | str:
        """A plan for a reduction on static data of a supported type, with a bounded mask; else the reason."""
        reduction = node.attrs.get("reduction", "none")
        reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
        if reduction == "none":
            return "no reduction: the parser takes it"
        if reduction not in _REDUCE:
            return f"unknown reduction {reduction!r}"
        data, indices = node.inputs[0], node.inputs[1]
        dtype, shape = dtype_of(data), static_shape(data)
        if str(dtype) not in _TYPES:
            return f"{dtype} data: rewritten for float32, float16, int32 and int64"
        if shape is None or not shape:
            return "the data's shape is not static (or it is 0-d)"
        assert dtype is not None
        if node.op == "ScatterElements":
            return _elements_plan(node, reduction, shape, dtype)
        tuple_shape = indices.shape
        k = tuple_shape[-1] if tuple_shape else None
        if not isinstance(k, int | np.integer) or not 1 <= k <= len(shape):
            return "the index tuples' length is not static"
        updates = static_shape(indices)
        count = int(np.prod(updates[:-1])) if updates is not None else None
        size = int(np.prod(shape))
        if count is None or count * size > MAX_MASK:
            return f"the mask would hold more than {MAX_MASK} elements (or the indices' shape is not static)"
        return ScatterPlan(reduction, shape, dtype, int(k), None)

    def rewrite(self, plan: ScatterPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """The masked reduction, combined with the data (module doc)."""
        scatter = _elements_reduction if ctx.node.op == "ScatterElements" else _nd_reduction
        reduced = scatter(plan, ctx)
        combine = _REDUCE[plan.reduction][1]
        (out,) = ctx.make_node(combine, [ctx.node.inputs[0], reduced], {}, 1, dtype=plan.dtype)
        return [out]


def _elements_plan(node: gs.Node, reduction: str, shape: tuple[int, ...], dtype: np.dtype) -> ScatterPlan | str:
    indices = node.inputs[1]
    rank = len(shape)
    axis = int(node.attrs.get("axis", 0))
    if not -rank <= axis < rank:
        return f"axis {axis} is out of range for rank {rank}"
    updates = static_shape(indices)
    if updates is None or rank_of(indices) != rank:
        return "the indices' shape is not static"
    if any(u > d for i, (u, d) in enumerate(zip(updates, shape, strict=True)) if i != axis % rank):
        return f"indices {list(updates)} larger than the data {list(shape)} off the axis"
    if int(np.prod(updates)) * shape[axis] > MAX_MASK:
        return f"the mask would hold more than {MAX_MASK} elements"
    return ScatterPlan(reduction, shape, dtype, axis % rank, updates)


def _identity(plan: ScatterPlan) -> np.ndarray:
    """The reduction's identity in the data's type: what a position no update lands on reduces to."""
    dtype = plan.dtype
    if plan.reduction in ("add", "mul"):
        return np.array([0 if plan.reduction == "add" else 1], dtype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.array([info.min if plan.reduction == "max" else info.max], dtype)
    return np.array([-np.inf if plan.reduction == "max" else np.inf], dtype)


def _wrapped(ctx: RewriteContext, indices: gs.Tensor, size: np.ndarray) -> gs.Tensor:
    """Negative indices counted from the end: ``Where(i < 0, i + size, i)``."""
    itype = dtype_of(indices) or np.dtype(np.int64)
    sizes = ctx.constant(size.astype(itype), "sizes")
    negative = ctx.typed(np.bool_).Less(indices, ctx.constant(np.zeros(1, itype), "zero_index"))
    return ctx.typed(itype).Where(negative, ctx.typed(itype).Add(indices, sizes), indices)


def _elements_reduction(plan: ScatterPlan, ctx: RewriteContext) -> gs.Tensor:
    """``[..., J, ...]``: the reduction of the updates landing on each position of the axis (padded to the data)."""
    node, op = ctx.node, ctx.typed(plan.dtype)
    axis, rank, size = plan.axis, len(plan.shape), plan.shape[plan.axis]
    indices = _wrapped(ctx, node.inputs[1], np.array([size]))
    itype = dtype_of(indices) or np.dtype(np.int64)
    positions = np.arange(size, dtype=itype).reshape([size if i == axis else 1 for i in range(rank + 1)])
    unsqueeze = ctx.constant(np.array([axis], np.int64), "position_axis")
    lifted = ctx.typed(itype).Unsqueeze(indices, unsqueeze)
    mask = ctx.typed(np.bool_).Equal(lifted, ctx.constant(positions, "positions"))
    spread = op.Where(mask, op.Unsqueeze(node.inputs[2], unsqueeze), ctx.constant(_identity(plan), "identity"))
    reduce = _REDUCE[plan.reduction][0]
    axes = ctx.constant(np.array([axis + 1], np.int64), "update_axis")
    (reduced,) = ctx.make_node(reduce, [spread, axes], {"keepdims": 0}, 1, dtype=plan.dtype)
    assert plan.updates_shape is not None
    short = [0 if i == axis else d - u for i, (u, d) in enumerate(zip(plan.updates_shape, plan.shape, strict=True))]
    if any(short):
        pads = ctx.constant(np.array([0] * rank + short, np.int64), "pads")
        reduced = op.Pad(reduced, pads, ctx.constant(_identity(plan).reshape(()), "pad_value"), mode="constant")
    return reduced


def _nd_reduction(plan: ScatterPlan, ctx: RewriteContext) -> gs.Tensor:
    """The data's shape: the reduction of the updates whose index tuple addresses each of the first k axes."""
    node, op = ctx.node, ctx.typed(plan.dtype)
    k, shape = plan.axis, plan.shape
    lead, rest = shape[:k], shape[k:]
    indices = _wrapped(ctx, node.inputs[1], np.array(lead))
    itype = dtype_of(indices) or np.dtype(np.int64)
    strides = np.array([int(np.prod(lead[i + 1 :])) for i in range(k)], itype)
    flat = ctx.typed(itype).ReduceSum(
        ctx.typed(itype).Mul(indices, ctx.constant(strides, "strides")),
        ctx.constant(np.array([-1], np.int64), "tuple_axis"),
        keepdims=0,
    )
    flat = ctx.typed(itype).Reshape(flat, np.array([1, -1], np.int64))  # [1, U]
    count = int(np.prod(lead))
    positions = ctx.constant(np.arange(count, dtype=itype).reshape(count, 1), "positions")  # [M, 1]
    mask = ctx.typed(np.bool_).Equal(flat, positions)  # [M, U]
    mask = ctx.typed(np.bool_).Reshape(mask, np.array([count, -1, *([1] * len(rest))], np.int64))
    updates = op.Reshape(node.inputs[2], np.array([1, -1, *rest], np.int64))  # [1, U, rest]
    spread = op.Where(mask, updates, ctx.constant(_identity(plan), "identity"))
    reduce = _REDUCE[plan.reduction][0]
    axes = ctx.constant(np.array([1], np.int64), "update_axis")
    (reduced,) = ctx.make_node(reduce, [spread, axes], {"keepdims": 0}, 1, dtype=plan.dtype)
    return op.Reshape(reduced, np.array(shape, np.int64))
