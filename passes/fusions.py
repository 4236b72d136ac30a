"""RMSNorm and rotary position embeddings as the opset-23 ops ``RMSNormalization`` and ``RotaryEmbedding``.

The exporter writes a transformers decoder's RMSNorm and RoPE as the ops of their Python code. At opset 23 and later
both are single ONNX ops, which TensorRT (10.15+, TensorRT-RTX 1.7: a rotary layer; RMSNormalization parsed and built)
and ONNX Runtime (1.32, float32 and float16) run, so the pass :func:`fuse_decoder_ops` puts them in:

- **RMSNorm** ``x * 1/Sqrt(ReduceMean(x^2, last axis) + eps)``, optionally times a constant weight over the last axis
  (``weight * normed``; Gemma's ``1 + weight`` arrives folded into one constant), becomes
  ``RMSNormalization(x, weight, axis=-1, epsilon=eps)``: the mean of squares is computed in float32
  (``stash_type=1``) whatever the input type, as transformers computes it. A ``Cast`` transformers puts around the
  normalisation (``hidden.to(float32)`` in a half model) stays where it is.
- **RoPE** with transformers' ``rotate_half``: ``x * cos + Concat(-x[..., h:], x[..., :h]) * sin`` where ``cos``
  and ``sin`` are ``Unsqueeze(Cos(Concat(f, f)), heads axis)`` (and ``Sin``) of the same angles ``f`` [batch,
  tokens, h], optionally times one constant (the attention scaling of scaled RoPE variants), becomes
  ``RotaryEmbedding(x, Cos(f), Sin(f))`` (``interleaved=0``, the 3-D cache form, no position ids: the angles are
  already per token). Partial rotary (GPT-NeoX, Phi) matches too: ``x`` is then the rotated slice. Interleaved
  rotary (GPT-J's ``rotate_every_two``) is not this pattern and stays as exported.

Every match is checked structurally (the same ``x`` in both products, halves of exactly half the head dim, the
same angles under ``Cos`` and ``Sin``), so a graph that only looks alike is left as it is; the rule's ``explain``
says why. Below opset 23 the pass does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from passes.rules import Facts, RewriteContext, RewriteRule, RulePass

#: The first opset with ``RMSNormalization`` and ``RotaryEmbedding``.
OPSET = 23
#: The op types the pass makes.
FUSED_OPS = ("RMSNormalization", "RotaryEmbedding")


def _producer(tensor: gs.Tensor, *ops: str) -> gs.Node | None:
    """The node of op type ``ops`` producing ``tensor``, or None."""
    node = tensor.inputs[0] if isinstance(tensor, gs.Variable) and tensor.inputs else None
    return node if node is not None and node.op in ops and (node.domain or "") == "" else None


def _constant(tensor: gs.Tensor) -> np.ndarray | None:
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    node = _producer(tensor, "Constant")
    value = node.attrs.get("value") if node is not None else None
    return np.asarray(value.values) if isinstance(value, gs.Constant) else None


def _only_consumer(tensor: gs.Tensor, node: gs.Node) -> bool:
    return len(tensor.outputs) == 1 and tensor.outputs[0] is node


def _last_axis(axes: np.ndarray | None, rank: int | None) -> bool:
    if axes is None or axes.size != 1:
        return False
    axis = int(axes.reshape(-1)[0])
    return axis == -1 or (rank is not None and axis == rank - 1)


def _rank(tensor: gs.Tensor) -> int | None:
    return None if tensor.shape is None else len(tensor.shape)


@dataclass(frozen=True)
class NormPlan:
    """RMSNormalization's input, weight (None: ones) and epsilon."""

    x: gs.Tensor
    weight: np.ndarray | None
    epsilon: float
    dim: int


class FuseRMSNorm(RewriteRule[NormPlan]):
    """``x * rsqrt(mean(x^2) + eps)`` (times a weight) -> ``RMSNormalization`` (module docstring). Its root is the
    weight's ``Mul`` when there is one, else the normalising ``Mul``."""

    name = "rms_normalization"
    ops = frozenset({"Mul"})

    def check(self, node: gs.Node, facts: Facts) -> NormPlan | str:
        """The plan, or why this Mul is not the end of an RMSNorm."""
        if facts.opset < OPSET:
            return f"opset {facts.opset} < {OPSET}"
        for normed, other in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            inner = _producer(normed, "Mul")
            weight = _constant(other)
            if inner is not None and weight is not None and weight.ndim >= 1 and _only_consumer(normed, node):
                plan = self._normalising(inner)
                if isinstance(plan, NormPlan):
                    if weight.size != plan.dim or weight.reshape(-1).shape[0] != weight.shape[-1]:
                        return f"the weight {other.name!r} is not one value per element of the last axis"
                    return NormPlan(plan.x, weight.reshape(-1), plan.epsilon, plan.dim)
        plan = self._normalising(node)
        if isinstance(plan, NormPlan):
            consumers = node.outputs[0].outputs
            weighted = (
                len(consumers) == 1
                and consumers[0].op == "Mul"
                and any(
                    _constant(t) is not None and np.asarray(_constant(t)).size == plan.dim for t in consumers[0].inputs
                )
            )
            if weighted:
                return "its weight's Mul is the root of this RMSNorm"
        return plan

    def _normalising(self, node: gs.Node) -> NormPlan | str:
        """``Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2), [-1]), eps))))`` in either order."""
        for x, scale in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            reciprocal = _producer(scale, "Reciprocal")
            sqrt = _producer(reciprocal.inputs[0], "Sqrt") if reciprocal is not None else None
            add = _producer(sqrt.inputs[0], "Add") if sqrt is not None else None
            if add is None:
                continue
            for mean_t, eps_t in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
                mean, eps = _producer(mean_t, "ReduceMean"), _constant(eps_t)
                if mean is None or eps is None or eps.size != 1 or mean.attrs.get("keepdims", 1) != 1:
                    continue
                axes = _constant(mean.inputs[1]) if len(mean.inputs) > 1 else None
                power = _producer(mean.inputs[0], "Pow")
                exponent = _constant(power.inputs[1]) if power is not None else None
                if power is None or power.inputs[0] is not x or exponent is None or float(exponent.reshape(-1)[0]) != 2:
                    continue
                shape = x.shape
                if not _last_axis(axes, _rank(x)) or not shape or not isinstance(shape[-1], int):
                    return "the mean is not over the last axis of a tensor whose last axis is known"
                chain = (power, mean, add, sqrt, reciprocal)
                if not all(_only_consumer(n.outputs[0], c) for n, c in zip(chain, (*chain[1:], node), strict=True)):
                    return "an intermediate of the normalisation is used elsewhere"
                return NormPlan(x, None, float(eps.reshape(-1)[0]), int(shape[-1]))
        return "not x * 1/Sqrt(ReduceMean(x^2, last axis) + eps)"

    def rewrite(self, plan: NormPlan, ctx: RewriteContext) -> gs.Tensor:
        """One RMSNormalization node (the weight in the input's type; ones when the graph had none)."""
        dtype = plan.x.dtype if plan.x.dtype is not None else np.float32
        weight = plan.weight if plan.weight is not None else np.ones(plan.dim)
        scale = ctx.constant(np.asarray(weight, dtype=np.dtype(dtype)), "scale")
        return ctx.typed(dtype).RMSNormalization(plan.x, scale, axis=-1, epsilon=plan.epsilon, stash_type=1)


@dataclass(frozen=True)
class RotaryPlan:
    """RotaryEmbedding's input, the angles [batch, tokens, half], and the constant the caches are scaled by."""

    x: gs.Tensor
    angles: gs.Tensor
    scale: float | None


class FuseRotaryEmbedding(RewriteRule[RotaryPlan]):
    """``x * cos + rotate_half(x) * sin`` -> ``RotaryEmbedding`` (module docstring); the root is the ``Add``."""

    name = "rotary_embedding"
    ops = frozenset({"Add"})

    def check(self, node: gs.Node, facts: Facts) -> RotaryPlan | str:
        """The plan, or why this Add is not a rotate-half RoPE."""
        if facts.opset < OPSET:
            return f"opset {facts.opset} < {OPSET}"
        reason = "not (x * cos) + (rotate_half(x) * sin)"
        for first, second in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            straight, rotated = _producer(first, "Mul"), _producer(second, "Mul")
            if straight is None or rotated is None:
                continue
            if not (_only_consumer(first, node) and _only_consumer(second, node)):
                continue
            for x, cos in ((straight.inputs[0], straight.inputs[1]), (straight.inputs[1], straight.inputs[0])):
                for half, sin in ((rotated.inputs[0], rotated.inputs[1]), (rotated.inputs[1], rotated.inputs[0])):
                    found = self._match(x, cos, half, sin, rotated)
                    if isinstance(found, RotaryPlan):
                        return found
                    reason = found
        return reason

    def _match(self, x: gs.Tensor, cos: gs.Tensor, half: gs.Tensor, sin: gs.Tensor, rotated: gs.Node) -> Any:
        shape = x.shape
        if shape is None or len(shape) != 4 or not isinstance(shape[-1], int) or shape[-1] % 2:
            return "x is not [batch, heads, tokens, head_dim] with a known, even head_dim"
        concat = _producer(half, "Concat")
        if concat is None or len(concat.inputs) != 2 or concat.attrs.get("axis") not in (-1, 3):
            return "the rotated half is not a Concat of two halves on the last axis"
        if not _only_consumer(half, rotated):
            return "the rotated half is used elsewhere"
        dim = shape[-1] // 2
        neg = _producer(concat.inputs[0], "Neg")
        upper = _producer(neg.inputs[0], "Slice") if neg is not None else None
        lower = _producer(concat.inputs[1], "Slice")
        if (
            upper is None
            or lower is None
            or not (_halves(upper, x, dim, shape[-1], shape[-1]) and _halves(lower, x, 0, dim, shape[-1]))
        ):
            return "the halves are not Concat(-x[..., h:], x[..., :h]) with h = head_dim / 2"
        cos_angles, cos_scale = _cache(cos, "Cos")
        sin_angles, sin_scale = _cache(sin, "Sin")
        if cos_angles is None or sin_angles is not cos_angles or cos_scale != sin_scale:
            return "cos and sin are not Unsqueeze(Cos|Sin(Concat(f, f)), 1) of the same angles f"
        angles_shape = getattr(cos_angles, "shape", None)
        if angles_shape is None or len(angles_shape) != 3 or angles_shape[-1] != dim:
            return "the angles are not [batch, tokens, head_dim / 2]"
        if angles_shape[0] != shape[0] and (angles_shape[0] == 1 or isinstance(shape[0], int)):
            # RotaryEmbedding's caches must have x's batch: one row of angles broadcast over a batch is refused at run
            return f"the angles' batch ({angles_shape[0]}) is not x's ({shape[0]})"
        return RotaryPlan(x, cos_angles, cos_scale)

    def rewrite(self, plan: RotaryPlan, ctx: RewriteContext) -> gs.Tensor:
        """Cos and Sin of the angles (scaled when the graph scaled them), then one RotaryEmbedding node."""
        dtype = plan.x.dtype if plan.x.dtype is not None else np.float32
        op = ctx.typed(dtype)
        if plan.scale is None:  # the queries' and the keys' RoPE share the caches
            cos = _made(plan.angles, "Cos") or op.Cos(plan.angles)
            sin = _made(plan.angles, "Sin") or op.Sin(plan.angles)
            return op.RotaryEmbedding(plan.x, cos, sin, interleaved=0)
        cos, sin = op.Cos(plan.angles), op.Sin(plan.angles)
        if plan.scale is not None:
            factor = ctx.constant(np.asarray(plan.scale, dtype=np.dtype(dtype)), "scale")
            cos, sin = op.Mul(cos, factor), op.Mul(sin, factor)
        return op.RotaryEmbedding(plan.x, cos, sin, interleaved=0)


def _made(angles: gs.Tensor, op: str) -> gs.Tensor | None:
    """The output of a ``Cos``/``Sin`` of ``angles`` that already feeds only RotaryEmbedding nodes, or None."""
    for node in angles.outputs:
        users = node.outputs[0].outputs if node.op == op else []
        if users and all(c.op == "RotaryEmbedding" for c in users):
            return node.outputs[0]
    return None


def _halves(node: gs.Node, x: gs.Tensor, start: int, end: int, length: int) -> bool:
    """``node`` is ``Slice(x, [start], [>= end], [last axis], [1])`` (``end`` is exact unless it reaches ``length``)."""
    if node.inputs[0] is not x or len(node.inputs) < 4:
        return False
    starts, ends, axes = (_constant(t) for t in node.inputs[1:4])
    steps = _constant(node.inputs[4]) if len(node.inputs) > 4 else np.ones(1)
    if any(v is None or v.size != 1 for v in (starts, ends, axes, steps)):
        return False
    assert starts is not None and ends is not None and steps is not None
    stop = int(ends.reshape(-1)[0])
    exact = stop == end or (end == length and stop >= length)
    return int(starts.reshape(-1)[0]) == start and exact and _last_axis(axes, 4) and int(steps.reshape(-1)[0]) == 1


def _cache(tensor: gs.Tensor, op: str) -> tuple[gs.Tensor | None, float | None]:
    """The angles ``f`` of ``Unsqueeze(op(Concat(f, f)) [* c], axis 1)``, and ``c`` (None when not scaled)."""
    unsqueeze = _producer(tensor, "Unsqueeze")
    if unsqueeze is None or len(unsqueeze.inputs) < 2:
        return None, None
    axes = _constant(unsqueeze.inputs[1])
    if axes is None or axes.reshape(-1).tolist() != [1]:
        return None, None
    value, scale = unsqueeze.inputs[0], None
    scaled = _producer(value, "Mul")
    if scaled is not None:
        for inner, factor in ((scaled.inputs[0], scaled.inputs[1]), (scaled.inputs[1], scaled.inputs[0])):
            constant = _constant(factor)
            if constant is not None and constant.size == 1 and _producer(inner, op) is not None:
                value, scale = inner, float(constant.reshape(-1)[0])
                break
    trig = _producer(value, op)
    concat = _producer(trig.inputs[0], "Concat") if trig is not None else None
    if concat is None or len(concat.inputs) != 2 or concat.inputs[0] is not concat.inputs[1]:
        return None, None
    if concat.attrs.get("axis") not in (-1, 2):
        return None, None
    return concat.inputs[0], scale


def fuse_decoder_ops() -> RulePass:
    """The pass: RMSNorm and rotate-half RoPE as ``RMSNormalization`` and ``RotaryEmbedding`` (opset >= 23)."""
    return RulePass("fuse_rms_norm_and_rope", (FuseRMSNorm(), FuseRotaryEmbedding()))
