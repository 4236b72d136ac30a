"""Bernoulli as a uniform draw compared with its probabilities: ``Cast(Less(RandomUniformLike(p), p))``.

Two reasons, one rewrite. TensorRT's parser has no Bernoulli (it takes ``RandomUniformLike``, ``Less`` and
``Cast``), so a model that samples from ``torch.bernoulli(p)`` stopped at the parser or ran that node outside
TensorRT. And ONNX Runtime's CPU kernel draws the complement: through 1.32 it returns 1 with probability ``1 - p``
(``p = 0.1`` gives a mean of 0.90), so the default backend's output departed from PyTorch's distribution and
validation failed a correct model. The rewrite is the function body the ONNX specification gives for Bernoulli:
a draw ``u`` from U[0, 1) is below ``p`` with probability ``p``, exactly (``p = 0`` never, ``p = 1`` always).

The ``seed`` attribute goes to the uniform draw; ``dtype`` (the output type, the input's when absent) to the Cast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.parser_fixes.values import dtype_of
from passes.rules import Facts, RewriteContext, RewriteRule

#: The probability types of Bernoulli that RandomUniformLike draws in (bfloat16 from opset 22, as Bernoulli).
_DRAW_TYPES = frozenset({"float16", "float32", "float64", "bfloat16"})


@dataclass(frozen=True)
class BernoulliPlan:
    """The probabilities' type (the draw's) and the output's ONNX element type."""

    dtype: np.dtype
    to: int


class BernoulliAsUniform(RewriteRule[BernoulliPlan]):
    """``Bernoulli(p)`` -> ``Cast(Less(RandomUniformLike(p), p), to=dtype)`` (module doc)."""

    name = "bernoulli_as_uniform"
    ops = frozenset({"Bernoulli"})

    def check(self, node: gs.Node, facts: Facts) -> BernoulliPlan | str:
        """A plan when the probabilities' type is known and a float type the uniform draw makes."""
        dtype = dtype_of(node.inputs[0])
        if dtype is None:
            return "the probabilities' type is unknown"
        if str(dtype) not in _DRAW_TYPES:
            return f"{dtype} probabilities: RandomUniformLike draws float16, float32, float64 and bfloat16"
        to = node.attrs.get("dtype")
        if to is None:
            to = onnx.helper.np_dtype_to_tensor_dtype(dtype)
        return BernoulliPlan(dtype, int(to))

    def rewrite(self, plan: BernoulliPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """The uniform draw (seeded as the node was), the comparison, the Cast to the output type."""
        p = ctx.node.inputs[0]
        seed = ctx.node.attrs.get("seed")
        draw = ctx.typed(plan.dtype).RandomUniformLike(p, low=0.0, high=1.0, **({} if seed is None else {"seed": seed}))
        below = ctx.typed(np.bool_).Less(draw, p)
        out_dtype = onnx.helper.tensor_dtype_to_np_dtype(plan.to)
        return [ctx.typed(out_dtype).Cast(below, to=plan.to)]
