"""An ``Attention`` that reads a KV cache through a Cast (a float32 island over a float16 cache) is written out as
MatMul, Softmax and MatMul in its own type.

Why: TensorRT-RTX 1.7.1's builder crashes (a segmentation fault, not an error: the process dies) on
``TensorScatter (float16 cache write) -> Cast (float32) -> Attention (float32)``, its attention marked decomposable
as our builds mark it. Bisected on the fp16 text step of transformers' IDEFICS, whose accuracy search kept one
self-attention in float32 while the static cache is float16: the four nodes alone crash it, with the key's or the
value's write alone, with or without a mask, with static or dynamic shapes; the same graph builds with the
attention in float16 (no Cast), with the key and value given as inputs instead of written by TensorScatter, or with
the attention written out as MatMul/Softmax in float32; the other way round (a float32 cache read by a float16
attention through a Cast) builds, and is left alone. ``tests/pipeline/generation/test_half_cross_attention_build.py``
holds the crashing graph.

The written-out form is what ``pipeline.generation`` emits with ``attention="decomposed"``
(:mod:`passes.written_attention`): a boolean mask selects the type's lowest value where False, a float mask is added
to the scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.precision.types import Inferred, dtype_of, infer, shape_of
from passes.rules import Facts, RewriteContext, RewriteRule, RulePass
from passes.written_attention import ScoreTerm, written_out_attention

#: The only attributes the written-out form reproduces (ONNX defaults otherwise: no causal mask, no cap, no extra
#: outputs, softmax in the inputs' type).
_HANDLED_ATTRS = frozenset({"scale", "q_num_heads", "kv_num_heads"})


@dataclass(frozen=True)
class _Plan:
    query: gs.Tensor
    key: gs.Tensor
    value: gs.Tensor
    mask: gs.Tensor | None
    mask_shape: tuple[int | str | None, ...]
    mask_is_bool: bool
    scale: float
    dtype: np.dtype


class CastCacheAttentionWrittenOut(RewriteRule[_Plan]):
    """``Attention(q, Cast(TensorScatter(...)), ...)`` (key or value) as MatMul/Softmax/MatMul (module doc)."""

    name = "cast_cache_attention_written_out"
    ops = frozenset({"Attention"})

    def check(self, node: gs.Node, facts: Facts) -> _Plan | str:
        """The plan of the written-out form, or why this ``Attention`` stays (module doc: which ones are taken)."""
        inputs = [t if t.name else None for t in node.inputs]
        if len(inputs) < 3 or any(t is not None for t in inputs[4:]):
            return "past_key, past_value or nonpad_kv_seqlen given: only query, key, value and a mask are written out"
        if any(t.name for t in node.outputs[1:]):
            return "present or qk outputs used: only the attention output is written out"
        extra = sorted(set(node.attrs) - _HANDLED_ATTRS)
        if extra:
            return f"attributes {', '.join(extra)} are not written out"
        query, key, value = inputs[0], inputs[1], inputs[2]
        if query is None or key is None or value is None:
            return "query, key or value missing"
        cast = next((c for c in (_producer(key), _producer(value)) if _reads_cache_write(c)), None)
        if cast is None:
            return "neither key nor value is a Cast to float32 of a TensorScatter output (a KV cache in a half type)"
        inferred: Inferred = facts.memo("precision_types", lambda: infer(facts.graph))
        shapes = [shape_of(t, inferred) for t in (query, key, value)]
        if any(s is None or len(s) != 4 for s in shapes):
            return "query, key and value are not all 4-D [batch, heads, sequence, dim]"
        mask = inputs[3] if len(inputs) > 3 else None
        mask_shape = () if mask is None else shape_of(mask, inferred)
        if mask_shape is None or (mask is not None and len(mask_shape) not in (2, 4)):
            return "the mask is not 2-D or 4-D"
        dim = shapes[0][3] if shapes[0] else None
        if "scale" in node.attrs:
            scale = float(node.attrs["scale"])
        elif isinstance(dim, int):
            scale = 1.0 / float(np.sqrt(dim))
        else:
            return "no scale attribute and the head size is not static"
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(cast.attrs["to"])))
        is_bool = mask is not None and dtype_of(mask, inferred) == onnx.TensorProto.BOOL
        return _Plan(query, key, value, mask, tuple(mask_shape), is_bool, scale, dtype)

    def rewrite(self, plan: _Plan, ctx: RewriteContext) -> gs.Tensor:
        """The attention's output, written out in the island's type: a boolean mask selects, a float one is added."""
        term = None
        if plan.mask is not None:
            one_head = len(plan.mask_shape) == 4 and plan.mask_shape[1] == 1
            term = ScoreTerm(plan.mask, one_head=one_head, rank=len(plan.mask_shape))
        return written_out_attention(
            ctx,
            plan.query,
            plan.key,
            plan.value,
            scale=plan.scale,
            dtype=plan.dtype,
            bias=None if plan.mask_is_bool else term,
            mask=term if plan.mask_is_bool else None,
        )


def _producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if tensor.inputs else None


def _reads_cache_write(node: gs.Node | None) -> bool:
    """``node`` is a Cast to float32 of a TensorScatter's output."""
    if node is None or node.op != "Cast" or not node.inputs or node.attrs.get("to") != onnx.TensorProto.FLOAT:
        return False
    source = _producer(node.inputs[0])
    return source is not None and source.op == "TensorScatter"


def write_out_cast_cache_attention() -> RulePass:
    """The pass of :class:`CastCacheAttentionWrittenOut` (run by the precision pass after its casts are placed)."""
    return RulePass("cast_cache_attention_written_out", (CastCacheAttentionWrittenOut(),))
