"""``Where`` choosing between boolean tensors, as ``And``/``Or``/``Not``.

The exporter writes ``mask.masked_fill(cond, False)`` and ``torch.where(c, mask_a, mask_b)`` on bool tensors as a
``Where`` whose data inputs are bool. TensorRT's parser takes it, but ONNX Runtime's CPU provider has no bool ``Where``
kernel and refuses to load the whole graph ("Could not find an implementation for Where(16)"), so every graph we
produce is rewritten to the logical form both run: ``Where(c, x, y) = Or(And(c, x), And(Not(c), y))``, exact, with
the same broadcast shape. A data input that is one constant value (what ``masked_fill`` writes) makes it shorter:
``Where(c, True, y) = Or(c, y)``, ``Where(c, False, y) = And(Not(c), y)``, ``Where(c, x, True) = Or(Not(c), x)``,
``Where(c, x, False) = And(c, x)``, used only when the constant's rank does not raise the result's rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import ValueResolver, dtype_of, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule

_BOOL = np.dtype(bool)


@dataclass(frozen=True)
class LogicPlan:
    """The condition and the two data inputs, each with its single constant value when it is one."""

    condition: gs.Tensor
    when_true: gs.Tensor
    when_false: gs.Tensor
    true_constant: bool | None
    false_constant: bool | None


class BooleanWhereAsLogic(RewriteRule[LogicPlan]):
    """``Where`` on bool data as ``And``/``Or``/``Not`` (see module doc)."""

    name = "boolean_where_as_logic"
    ops = frozenset({"Where"})

    def check(self, node: gs.Node, facts: Facts) -> LogicPlan | str:
        """A plan when the data inputs are bool; else why the node is left."""
        if len(node.inputs) != 3:
            return "not three inputs"
        types = {dtype_of(t) for t in (*node.inputs[1:], node.outputs[0])} - {None}
        if types != {_BOOL}:
            return "data is not bool (ONNX Runtime and TensorRT run Where on it)"
        resolver = ValueResolver(facts.opset)
        condition, x, y = node.inputs
        others = [rank_of(t) for t in node.inputs]
        return LogicPlan(
            condition, x, y, _single(resolver, x, others[0], others[2]), _single(resolver, y, others[0], others[1])
        )

    def rewrite(self, plan: LogicPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """The logical form, shortened where a data input is one constant value."""
        op = ctx.typed(_BOOL)
        c, x, y = plan.condition, plan.when_true, plan.when_false
        if plan.true_constant is not None:
            return [op.Or(c, y) if plan.true_constant else op.And(op.Not(c), y)]
        if plan.false_constant is not None:
            return [op.Or(op.Not(c), x) if plan.false_constant else op.And(c, x)]
        return [op.Or(op.And(c, x), op.And(op.Not(c), y))]


def _single(resolver: ValueResolver, tensor: gs.Tensor, *other_ranks: int | None) -> bool | None:
    """The tensor's one value when it is a constant holding one, whose rank is at most the other inputs' (so leaving
    it out does not change the result's shape); else None."""
    value = resolver.resolve(tensor)
    if value is None or value.size != 1:
        return None
    if value.ndim and any(rank is None or rank < value.ndim for rank in other_ranks):
        return None
    return bool(value.reshape(-1)[0])
