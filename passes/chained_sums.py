"""Chained normalisations' sums as MatMuls with a vector of ones: TensorRT-RTX's builder time grows about 3x per link
of a chain ``x / (ReduceSum(x) + eps)``.

Sinkhorn-Knopp iterations unrolled in a graph (DeepSeek-V4's and GLM-5 Next's hyper-connections: a checkpoint's 20
iterations are 39 chained divisions by a sum over alternating axes of a small matrix) are such a chain. TensorRT-RTX
1.7 fuses the chain of reductions and pointwise ops and its builder time grows with each link: 2 links 0.1 s, 4 links
0.4 s, 6 links 1.8 s, 8 links 40 s, 12 links not built in 300 s (``benchmarks/probe_chained_normalisation.py``).
The same chain with each sum computed as a MatMul against a vector of ones builds 40 links in 1.8 s: the MatMul
ends the fusion. The parser accepts both; the builder is what fails.

A sum over the last axis ``ReduceSum(x, axes=[-1], keepdims=1)`` is ``MatMul(x, ones[k, 1])``; over the one before
it, ``MatMul(ones[1, k], x)``: the same shape, the same values within float rounding (the order of the additions).
The rule rewrites only the sums of a chain of :data:`MIN_LINKS` or more normalisations: a link is a ``Div`` of a
tensor by its own sum over one of its last two axes (a constant added to the sum or not), and the next link divides
that ``Div``'s output. A single normalisation (an L1 norm, a mean) is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import ValueResolver, dtype_of, is_omitted, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule

#: The shortest chain rewritten: 2 links build in 0.1 s as they are, 4 in 0.4 s, 6 in 1.8 s (0.3 s rewritten).
MIN_LINKS = 4

_FLOAT_TYPES = frozenset({"float32", "float16"})


@dataclass(frozen=True)
class SumPlan:
    """The sum's axis (True: the last one, else the one before it), its extent and the type of the ones."""

    last: bool
    extent: int
    dtype: np.dtype


class ChainedSumsAsMatMul(RewriteRule[SumPlan]):
    """``ReduceSum(x, [axis], keepdims=1)`` of a chain of normalisations -> ``MatMul`` with ones (module doc)."""

    name = "chained_sums_as_matmul"
    ops = frozenset({"ReduceSum"})

    def check(self, node: gs.Node, facts: Facts) -> SumPlan | str:
        """A plan for a sum over one of the last two static axes of a float tensor in a long enough chain."""
        if int(node.attrs.get("keepdims", 1)) != 1:
            return "keepdims=0: only a kept axis has a MatMul's shape"
        axes = _axes(node, facts)
        if axes is None or len(axes) != 1:
            return "not a sum over one known axis"
        x = node.inputs[0]
        rank, dtype = rank_of(x), dtype_of(x)
        if rank is None or rank < 2:
            return "the input's rank is unknown or below 2"
        if str(dtype) not in _FLOAT_TYPES:
            return f"{dtype} input: rewritten for float32 and float16"
        axis = int(axes[0]) % rank
        if axis < rank - 2:
            return f"a sum over axis {axis} of {rank}: a MatMul sums over the last two only"
        assert x.shape is not None
        extent = x.shape[axis]
        if not isinstance(extent, int | np.integer) or extent < 1:
            return f"axis {axis} has no static extent ({extent!r})"
        users = list(node.outputs[0].outputs)
        users += [d for add in users if add.op == "Add" for d in add.outputs[0].outputs]
        links = [d for d in users if _divided(d) is node]
        if not links:
            return "its sum divides nothing: not a normalisation"
        length = max(_chain_length(d) for d in links)
        if length < MIN_LINKS:
            return f"a chain of {length} normalisation(s): {MIN_LINKS} or more are rewritten"
        assert dtype is not None
        return SumPlan(axis == rank - 1, int(extent), dtype)

    def rewrite(self, plan: SumPlan, ctx: RewriteContext) -> gs.Tensor:
        """The MatMul with ones in place of the sum."""
        x = ctx.node.inputs[0]
        shape = (plan.extent, 1) if plan.last else (1, plan.extent)
        ones = ctx.constant(np.ones(shape, plan.dtype), "ones")
        op = ctx.typed(plan.dtype)
        out: gs.Tensor = op.MatMul(x, ones) if plan.last else op.MatMul(ones, x)
        return out


def _axes(node: gs.Node, facts: Facts) -> list[int] | None:
    if len(node.inputs) >= 2 and not is_omitted(node.inputs[1]):
        value = facts.memo("value_resolver", lambda: ValueResolver(facts.opset)).resolve(node.inputs[1])
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]
    attr = node.attrs.get("axes")
    return None if attr is None else [int(v) for v in attr]


def _summed(node: gs.Node, x: gs.Tensor) -> bool:
    """Is ``node`` a sum of ``x`` over one axis: a kept-axis ReduceSum, or a MatMul of ``x`` with ones?"""
    if node.op == "ReduceSum":
        return node.inputs[0] is x and int(node.attrs.get("keepdims", 1)) == 1
    if node.op == "MatMul" and x in node.inputs:
        other = node.inputs[1] if node.inputs[0] is x else node.inputs[0]
        return isinstance(other, gs.Constant) and bool(np.all(np.asarray(other.values) == 1))
    return False


def _divided(div: gs.Node) -> gs.Node | None:
    """The sum node a link ``div`` divides its dividend by (a constant added to it or not), or None."""
    if div.op != "Div" or len(div.inputs) != 2:
        return None
    x, divisor = div.inputs
    for _ in range(2):
        if len(divisor.inputs) != 1:
            return None
        producer = divisor.inputs[0]
        if _summed(producer, x):
            return producer
        if producer.op != "Add":
            return None
        others = [t for t in producer.inputs if not _is_constant(t)]
        if len(others) != 1 or len(producer.inputs) != 2:
            return None
        divisor = others[0]
    return None


def _is_constant(tensor: gs.Tensor) -> bool:
    """An initializer or a ``Constant`` node's output."""
    return isinstance(tensor, gs.Constant) or (len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant")


def _chain_length(link: gs.Node) -> int:
    """The links before ``link``, it, and the links after it."""
    length, node = 1, link
    while len(node.inputs[0].inputs) == 1 and _divided(node.inputs[0].inputs[0]) is not None:
        node = node.inputs[0].inputs[0]
        length += 1
    node = link
    while True:
        out = node.outputs[0]
        after = [d for d in out.outputs if d.inputs and d.inputs[0] is out and _divided(d) is not None]
        if not after:
            return length
        node = after[0]
        length += 1
