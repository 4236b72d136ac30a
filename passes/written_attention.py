"""Attention written out as MatMul, Softmax and MatMul, for the graphs where an ONNX ``Attention`` node cannot stay:
``pipeline.generation``'s ``attention="decomposed"`` form (and its biased attention on TensorRT) and the precision
pass's float32 attention over a half-type KV cache (:mod:`passes.precision.cache_attention`).

The query heads are folded into [batch, kv_heads, groups, steps, dim], so grouped keys and values are read once per
KV head and never repeated; a float bias is added to the scaled scores, a cap (``softcap``) applied, then a boolean
mask selects the type's lowest value where it is False.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx_graphsurgeon as gs


class GraphBuilder(Protocol):
    """What both a converter's and a rewrite rule's context give: ``op.<OpType>(...)`` and ``constant(array)``."""

    op: Any

    def constant(self, value: Any, name: str = "const") -> gs.Constant:
        """``value`` (a numpy array) as a constant of the graph being built."""
        ...


@dataclass(frozen=True)
class ScoreTerm:
    """A mask or bias over the scores [batch, q_heads, steps, keys]: 2-D [steps, keys] (``rank`` 2), one head for
    every query head (``one_head``: [B or 1, 1, S, K]), or one per query head."""

    tensor: gs.Tensor
    one_head: bool = False
    rank: int = 4


def written_out_attention(
    ctx: GraphBuilder,
    query: gs.Tensor,
    key: gs.Tensor,
    value: gs.Tensor,
    *,
    scale: float,
    dtype: np.dtype,
    bias: ScoreTerm | None = None,
    mask: ScoreTerm | None = None,
    softcap: float = 0.0,
) -> gs.Tensor:
    """``softmax(mask(cap(q k^T * scale + bias))) v`` of [B, Hq, S, D] queries and [B, Hkv, K, D] keys and values
    (module doc), as [B, Hq, S, value width]."""
    q_shape = ctx.op.Shape(query)
    kv_heads = ctx.op.Slice(ctx.op.Shape(key), _ints(ctx, 1), _ints(ctx, 2))
    batch = ctx.op.Slice(q_shape, _ints(ctx, 0), _ints(ctx, 1))
    rest = ctx.op.Slice(q_shape, _ints(ctx, 2), _ints(ctx, 4))
    q = ctx.op.Reshape(query, ctx.op.Concat(batch, kv_heads, _ints(ctx, -1), rest, axis=0))  # [B, Hkv, G, S, D]
    k = ctx.op.Unsqueeze(key, _ints(ctx, 2))
    v = ctx.op.Unsqueeze(value, _ints(ctx, 2))
    scores = ctx.op.Mul(
        ctx.op.MatMul(q, ctx.op.Transpose(k, perm=[0, 1, 2, 4, 3])), ctx.constant(np.array(scale, dtype))
    )
    if bias is not None:
        scores = ctx.op.Add(scores, _grouped(ctx, bias, kv_heads))
    if softcap > 0:
        cap = ctx.constant(np.array(softcap, dtype))
        scores = ctx.op.Mul(ctx.op.Tanh(ctx.op.Div(scores, cap)), cap)
    if mask is not None:
        lowest = ctx.constant(np.array(np.finfo(dtype).min, dtype))
        scores = ctx.op.Where(_grouped(ctx, mask, kv_heads), scores, lowest)
    out = ctx.op.MatMul(ctx.op.Softmax(scores, axis=-1), v)
    # a value may be narrower than a query (multi-head latent attention's 128 against 192)
    width = ctx.op.Slice(ctx.op.Shape(value), _ints(ctx, 3), _ints(ctx, 4))
    return ctx.op.Reshape(out, ctx.op.Concat(ctx.op.Slice(q_shape, _ints(ctx, 0), _ints(ctx, 3)), width, axis=0))


def _grouped(ctx: GraphBuilder, term: ScoreTerm, kv_heads: gs.Tensor) -> gs.Tensor:
    """``term`` broadcast against the grouped scores [B, Hkv, G, S, K]: 2-D as it is, one head unsqueezed, one per
    query head folded like the queries."""
    if term.rank == 2:
        return term.tensor
    if term.one_head:
        return ctx.op.Unsqueeze(term.tensor, _ints(ctx, 2))
    dims = ctx.op.Shape(term.tensor)
    head = ctx.op.Slice(dims, _ints(ctx, 0), _ints(ctx, 1))
    rest = ctx.op.Slice(dims, _ints(ctx, 2), _ints(ctx, 4))
    return ctx.op.Reshape(term.tensor, ctx.op.Concat(head, kv_heads, _ints(ctx, -1), rest, axis=0))


def _ints(ctx: GraphBuilder, *values: int) -> gs.Constant:
    return ctx.constant(np.array(values, np.int64))
