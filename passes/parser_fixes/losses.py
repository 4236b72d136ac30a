"""``NegativeLogLikelihoodLoss`` and ``SoftmaxCrossEntropyLoss`` (what PyTorch's ``nll_loss`` and ``cross_entropy``
with class-index targets export to) as the ops of their ONNX definitions, which TensorRT's parser has no importer
for (it fails with "false").

With ``t`` the target, ``ok = t != ignore_index`` and ``t' = Where(ok, t, 0)`` (a valid index for the gathers):
``w = Where(ok, weight[t'], 0)`` (``Cast(ok)`` without weights), ``loss = -GatherElements(input, t', axis=1) * w``;
``reduction='sum'`` sums it, ``'mean'`` divides the sum by ``sum(w)``, as the ONNX definition does (all targets
ignored: 0 / 0 = NaN, as in PyTorch). SoftmaxCrossEntropyLoss is the same on ``LogSoftmax(scores, axis=1)``, its
optional second output. Every op is the definition's, in its order, so the values are the original's up to the
order of the float sum in the reductions. Dynamic shapes are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import dtype_of, is_omitted, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule

_FLOAT_TYPES = frozenset({"float32", "float16", "bfloat16"})
_INDEX_TYPES = frozenset({"int32", "int64"})


@dataclass(frozen=True)
class LossPlan:
    """What the loss node becomes: its reduction, ignored index, and the dtypes of scores and targets."""

    reduction: str  # none, sum, mean
    ignore_index: int | None
    dtype: np.dtype
    index_dtype: np.dtype
    weighted: bool


class ClassLossToGather(RewriteRule[LossPlan]):
    """``NegativeLogLikelihoodLoss`` / ``SoftmaxCrossEntropyLoss`` -> ``GatherElements`` of the log-probabilities,
    weights, ``Where`` for the ignored index, ``ReduceSum`` and ``Div`` (module doc)."""

    name = "class_loss_to_gather"
    ops = frozenset({"NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"})

    def check(self, node: gs.Node, facts: Facts) -> LossPlan | str:
        """A plan for float scores of rank >= 2 and integer class targets; else the reason."""
        scores, target = node.inputs[0], node.inputs[1]
        dtype, index_dtype, rank = dtype_of(scores), dtype_of(target), rank_of(scores)
        if str(dtype) not in _FLOAT_TYPES:
            return f"{dtype} scores: rewritten for float32, float16 and bfloat16"
        if str(index_dtype) not in _INDEX_TYPES:
            return f"{index_dtype} target: class indices must be int32 or int64"
        if rank is None or rank < 2:
            return "the scores' rank is unknown or below 2"
        reduction = node.attrs.get("reduction", "mean")
        reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
        if reduction not in ("none", "sum", "mean"):
            return f"unknown reduction {reduction!r}"
        ignore = node.attrs.get("ignore_index")
        weighted = len(node.inputs) > 2 and not is_omitted(node.inputs[2])
        assert dtype is not None and index_dtype is not None
        return LossPlan(reduction, None if ignore is None else int(ignore), dtype, index_dtype, weighted)

    def rewrite(self, plan: LossPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """The definition's ops (module doc); the log-probabilities are the second output of the cross entropy."""
        node = ctx.node
        op, boolean = ctx.typed(plan.dtype), ctx.typed(np.bool_)
        scores, target = node.inputs[0], node.inputs[1]
        softmax = node.op == "SoftmaxCrossEntropyLoss"
        log_prob = op.LogSoftmax(scores, axis=1) if softmax else scores
        index, ok = target, None
        if plan.ignore_index is not None:
            ignored = ctx.constant(np.array([plan.ignore_index], plan.index_dtype), "ignore_index")
            ok = boolean.Not(boolean.Equal(target, ignored))
            index = ctx.typed(plan.index_dtype).Where(ok, target, ctx.constant(np.zeros(1, plan.index_dtype), "zero"))
        axis = ctx.constant(np.array([1], np.int64), "class_axis")
        picked = op.GatherElements(log_prob, ctx.typed(plan.index_dtype).Unsqueeze(index, axis), axis=1)
        loss = op.Neg(op.Squeeze(picked, axis))
        weight = _weights(plan, ctx, index, ok)
        if weight is not None:
            loss = op.Mul(loss, weight)
        result = _reduce(plan, ctx, loss, weight)
        outputs = [result]
        if len(node.outputs) > 1:
            outputs.append(log_prob if softmax else node.outputs[1])
        return outputs


def _weights(plan: LossPlan, ctx: RewriteContext, index: gs.Tensor, ok: gs.Tensor | None) -> gs.Tensor | None:
    """Each element's weight: ``weight[t]`` (0 where ignored), ``Cast(ok)`` without weights, None if neither."""
    op = ctx.typed(plan.dtype)
    zero = ctx.constant(np.zeros(1, plan.dtype), "zero_weight")
    if plan.weighted:
        weight = op.Gather(ctx.node.inputs[2], index, axis=0)
        return weight if ok is None else op.Where(ok, weight, zero)
    return None if ok is None else op.Cast(ok, to=_onnx_type(plan.dtype))


def _reduce(plan: LossPlan, ctx: RewriteContext, loss: gs.Tensor, weight: gs.Tensor | None) -> gs.Tensor:
    op = ctx.typed(plan.dtype)
    if plan.reduction == "none":
        return loss
    total = op.ReduceSum(loss, keepdims=0)
    if plan.reduction == "sum":
        return total
    if weight is None:
        return op.ReduceMean(loss, keepdims=0)
    return op.Div(total, op.ReduceSum(weight, keepdims=0))


def _onnx_type(dtype: np.dtype) -> int:
    return int(onnx.helper.np_dtype_to_tensor_dtype(dtype))
