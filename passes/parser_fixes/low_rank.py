"""Ops on tensors of too low a rank for TensorRT's parser, computed on the input with leading axes of size 1 added.

The parser (TensorRT-RTX 1.7 measured) rejects ``Softmax``, ``LogSoftmax``, ``Hardmax``, ``ArgMax`` and ``ArgMin``
on a vector ("at least 2 dimensions are required for input"; ONNX defines them from rank 1), and every ``Reduce*``
on a 0-d input ("at least 1 dimensions are required"). PyTorch writes these for a vector's softmax or argmax and
for any reduction of a scalar (``x.mean()`` of a loss). CumSum and LpNormalization, which the parser rejects on 0-d
inputs too, are left: ONNX Runtime does not run them there either, so no graph that validates has them.

The rewrite: ``Unsqueeze`` the input to the rank the parser wants (new axes in front), run the same op with its axis
moved by the number of added axes, ``Squeeze`` the added axes off the output. A size-1 axis changes no value: the
op computes on the same elements in the same order, so the results are exactly the original's (ArgMax's index
along the kept axis is unchanged). Leading axes are the ones added because an ONNX axis attribute counted from the
end (``-1``) still names the same axis, and the kept output axes stay in front for the ``Squeeze``. Unsqueeze and
Squeeze with constant axes keep dynamic dimensions dynamic.

A reduction of a 0-d tensor reduces its one element whatever ``axes`` says (``[]``, ``[0]`` or ``[-1]``); the
lifted reduction reduces axis 0 of the 1-element vector without ``keepdims``, so its output is 0-d as the
original's was. A no-op reduction (``noop_with_empty_axes`` and no axes) is left: the parser takes it.

``RandomNormalLike`` and ``RandomUniformLike`` of a 0-d tensor (``torch.randn_like`` of a scalar) parse but fail in
the builder ("Copy operation '..._shape_concat' has 1 inputs"); lifted the same way, they draw one value from the
same distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.reduce_axes import REDUCE_OPS
from passes.parser_fixes.values import ValueResolver, dtype_of, is_omitted, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule

#: The rank the parser needs for each op's (first) input.
MIN_RANK: dict[str, int] = {
    "Softmax": 2, "LogSoftmax": 2, "Hardmax": 2, "ArgMax": 2, "ArgMin": 2, **dict.fromkeys(REDUCE_OPS, 1),
    "RandomNormalLike": 1, "RandomUniformLike": 1,
}  # fmt: skip
_AXIS_DEFAULTS = {"Softmax": -1, "LogSoftmax": -1, "Hardmax": -1, "ArgMax": 0, "ArgMin": 0}
_ARG_OPS = frozenset({"ArgMax", "ArgMin"})
_RANDOM_OPS = frozenset({"RandomNormalLike", "RandomUniformLike"})
#: Opsets from which ReduceX takes ``axes`` as an input (before: an attribute).
_AXES_INPUT_FROM = {**dict.fromkeys(REDUCE_OPS, 18), "ReduceSum": 13}


@dataclass(frozen=True)
class LiftPlan:
    """How to lift one node: leading axes to add, the op's new attributes and (Reduce from opset 18) the axes."""

    added: int  # leading size-1 axes added to the input and squeezed off every output
    dtype: np.dtype  # the input's dtype
    out_dtype: np.dtype  # the output's
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[Any, ...] = ()  # the lifted node's inputs after the first (numpy arrays become constants)


class LiftLowRank(RewriteRule[LiftPlan]):
    """``Softmax``/``LogSoftmax``/``Hardmax``/``ArgMax``/``ArgMin`` on a vector, ``Reduce*`` and ``Random*Like`` on a
    0-d input ->
    ``Squeeze(op(Unsqueeze(x)))`` with leading size-1 axes (module doc)."""

    name = "lift_low_rank"
    ops = frozenset(MIN_RANK)

    def looks_at(self, node: gs.Node) -> bool:
        """One of the ops, on an input of too low (or unknown) a rank: a Reduce on a matrix is none of its business
        (so the check report does not list this fix beside every Reduce it flags)."""
        return super().looks_at(node) and _too_low(node) is not None

    def reason(self, node: gs.Node, facts: Facts) -> str | None:
        """Why the rule leaves ``node`` (None: it would rewrite it), the input's rank included."""
        if super().looks_at(node) and _too_low(node) is None:
            rank = rank_of(node.inputs[0])
            return f"the input has rank {rank}; the parser takes {node.op} from rank {MIN_RANK[node.op]}"
        return super().reason(node, facts)

    def check(self, node: gs.Node, facts: Facts) -> LiftPlan | str:
        """A plan when the input's rank is known and below what the parser needs; else the reason."""
        x = node.inputs[0]
        rank, dtype = rank_of(x), dtype_of(x)
        if rank is None:
            return "the input's rank is unknown"
        wanted = MIN_RANK[node.op]
        if rank >= wanted:
            return f"the input has rank {rank}; the parser takes {node.op} from rank {wanted}"
        if dtype is None:
            return "the input's dtype is unknown"
        added = wanted - rank
        if node.op in REDUCE_OPS:
            return _reduce_plan(node, facts, dtype)
        if node.op in _RANDOM_OPS:
            return LiftPlan(added, dtype, dtype_of(node.outputs[0]) or dtype, dict(node.attrs))
        if node.op in ("Softmax", "LogSoftmax", "Hardmax") and facts.opset < 13:
            return f"opset {facts.opset}: {node.op} before opset 13 flattens to 2-D around its axis (not rewritten)"
        axis = int(node.attrs.get("axis", _AXIS_DEFAULTS[node.op]))
        if not -rank <= axis < rank:
            return f"axis {axis} is out of range for rank {rank}"
        out_dtype = np.dtype(np.int64) if node.op in _ARG_OPS else dtype
        return LiftPlan(added, dtype, out_dtype, {**node.attrs, "axis": axis % rank + added})

    def rewrite(self, plan: LiftPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """Unsqueeze the input, run the op lifted, Squeeze the added axes off (module doc)."""
        node = ctx.node
        x = node.inputs[0]
        front = ctx.constant(np.arange(plan.added, dtype=np.int64), "added_axes")
        lifted = ctx.typed(plan.dtype).Unsqueeze(x, front)
        out_dtype = plan.out_dtype
        inputs = [ctx.constant(v, "axes") for v in plan.inputs]
        (y,) = ctx.make_node(node.op, [lifted, *inputs], plan.attrs, 1, dtype=out_dtype)
        if node.op in REDUCE_OPS:
            return [y]  # reduced without keepdims: 0-d already
        return [ctx.typed(out_dtype).Squeeze(y, front)]


def _reduce_plan(node: gs.Node, facts: Facts, dtype: np.dtype) -> LiftPlan | str:
    """A 0-d reduction: its one element reduced along axis 0 of a 1-element vector."""
    if len(node.inputs) > 1 and not is_omitted(node.inputs[1]):
        resolved = facts.memo("value_resolver", lambda: ValueResolver(facts.opset)).resolve(node.inputs[1])
        if resolved is None:
            return "axes is not computable before running the graph"
        axes = [int(a) for a in resolved.reshape(-1)]
    else:
        axes = [int(a) for a in node.attrs.get("axes", [])]
    if any(a not in (0, -1) for a in axes):
        return f"axes {axes} are out of range for a 0-d input"
    if not axes and node.attrs.get("noop_with_empty_axes", 0):
        return "a no-op reduction (noop_with_empty_axes, no axes): the parser takes it"
    attrs = {k: v for k, v in node.attrs.items() if k not in ("axes", "keepdims", "noop_with_empty_axes")}
    attrs["keepdims"] = 0
    axis = np.zeros(1, np.int64)
    if facts.opset >= _AXES_INPUT_FROM[node.op]:
        return LiftPlan(1, dtype, dtype, attrs, (axis,))
    attrs["axes"] = [0]
    return LiftPlan(1, dtype, dtype, attrs)


def _too_low(node: gs.Node) -> int | None:
    """The input's rank when it is unknown (-1) or below what the parser needs; None when the parser takes it."""
    rank = rank_of(node.inputs[0]) if node.inputs else None
    if rank is None:
        return -1
    return rank if rank < MIN_RANK[node.op] else None
