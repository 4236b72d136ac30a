"""Arithmetic on a float and an integer tensor, cast as PyTorch promotes it.

The exporter writes some ops (``torch.masked.var``/``std``'s ``Div`` of a float sum by an int64 count) with one float
and one integer input. ONNX requires both inputs of ``Add``/``Sub``/``Mul``/``Div`` to have one type, so ONNX Runtime
refuses to load the graph ("Type parameter (T) of Optype (Div) bound to different types") and TensorRT rejects it
("ElementWiseOperation DIV must have same input types"). PyTorch's type promotion makes the integer operand the float
operand's type; the rule inserts that ``Cast`` (exact for integers up to 2^24 in float32, as in PyTorch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.rules import Facts, RewriteContext, RewriteRule


@dataclass(frozen=True)
class CastPlan:
    """Which input to cast, and to which ONNX type."""

    index: int
    to: int


def _kind(tensor: gs.Tensor) -> str | None:
    dtype = getattr(tensor, "dtype", None)
    if dtype is None:
        return None
    try:
        kind = np.dtype(dtype).kind
    except TypeError:  # an ONNX-only type (bfloat16, float8) is a float
        return "f"
    return {"f": "f", "i": "i", "u": "i", "b": "i"}.get(kind)


class MixedTypeArithmetic(RewriteRule[CastPlan]):
    """Cast the integer input of a float-and-integer ``Add``/``Sub``/``Mul``/``Div`` to the float input's type."""

    name = "mixed_type_arithmetic"
    ops = frozenset({"Add", "Sub", "Mul", "Div"})

    def check(self, node: gs.Node, facts: Facts) -> CastPlan | str:
        """The integer input and the float type, or why the node is left (same kinds, or a type unknown)."""
        if len(node.inputs) != 2:
            return "not two inputs"
        kinds = [_kind(t) for t in node.inputs]
        if None in kinds:
            return "an input's type is unknown"
        if kinds[0] == kinds[1]:
            return "both inputs are of one kind (float or integer)"
        index = kinds.index("i")
        float_input = node.inputs[1 - index]
        return CastPlan(index, int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(float_input.dtype))))

    def rewrite(self, plan: CastPlan, ctx: RewriteContext) -> None:
        """The node reads its integer input through a ``Cast`` to the float input's type (edited in place)."""
        ctx.node.inputs[plan.index] = ctx.op.Cast(ctx.node.inputs[plan.index], to=plan.to)
