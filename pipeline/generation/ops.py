"""The two operations a cached decoder step is made of, as ``torch.library`` ops with ONNX converters.

``pipeline_generation::kv_write`` writes a step's keys (or values) into a layer's static cache at the step's
position and returns the whole cache; it becomes ONNX ``TensorScatter`` (opset 24), which TensorRT maps to its
KV-cache-update layer. ``pipeline_generation::attention`` is attention over the whole static cache with an explicit
boolean mask and grouped key/value heads kept grouped; it becomes ONNX ``Attention`` (opset 23) without ``is_causal``
(upper-left aligned: wrong for decode), without ``past_key`` (TensorRT's parser rejects it) and without
``nonpad_kv_seqlen`` (TensorRT drops it with only a warning). Both ops are opaque to the exporter and replaced by
their converters in the lowering pass, so the graph holds exactly these nodes.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.context import ConverterContext
from converters.errors import InputError
from converters.registry import ConverterRegistry
from converters.settings import Settings
from passes.written_attention import ScoreTerm, written_out_attention
from pipeline.generation import PLAIN_FORWARD

logger = logging.getLogger(__name__)

#: ONNX ``TensorScatter`` exists from opset 24 (``Attention`` from 23): the opset every cached step exports at.
GENERATION_OPSET = 24


@torch.library.custom_op("pipeline_generation::kv_write", mutates_args=())
def kv_write(cache: torch.Tensor, update: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``cache`` [batch, heads, capacity, dim] with ``update`` [batch, heads, steps, dim] written at sequence
    positions ``position .. position + steps`` (``position``: a 0-d int64 tensor, the same for every row)."""
    start = int(position.item())
    out = cache.clone()
    out[:, :, start : start + update.shape[2]] = update
    return out


@kv_write.register_fake
def _(cache: torch.Tensor, update: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(cache)


@torch.library.custom_op("pipeline_generation::attention", mutates_args=())
def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    """Scaled dot-product attention of ``query`` [batch, q_heads, steps, dim] over ``key``/``value`` [batch,
    kv_heads, capacity, dim] (q_heads a multiple of kv_heads: grouped), where ``mask`` [batch, 1, steps, capacity]
    is True; ``softcap`` > 0 caps the scores as ``softcap * tanh(scores / softcap)`` (Gemma 2).

    float32 and float64 without a cap run PyTorch's fused ``scaled_dot_product_attention`` (the same values within
    1e-6 relative, without the [batch, heads, steps, capacity] score tensors: a 2048-token prefill over a 2048 cache
    in 0.27 s instead of 0.97 s), unless a query sees no position (it gives 0 there, the written-out form NaN, which
    the reference has always given). Half types keep the written-out form: the fused kernel accumulates in float32,
    which would make the reference of a float16 graph more accurate than PyTorch's own float16 arithmetic."""
    if softcap == 0 and query.dtype in (torch.float32, torch.float64) and bool(mask.any(-1).all()):
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=True
        )
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), value)


@attention.register_fake
def _(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


@torch.library.custom_op("pipeline_generation::attention_biased", mutates_args=())
def attention_biased(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """:func:`attention` with an additive ``bias`` on the scores (broadcast to [batch, q_heads, steps, capacity]:
    T5's relative position bias), as transformers adds it before the mask."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale + bias
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), value)


@attention_biased.register_fake
def _(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


def attention_with_sinks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    sinks: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`attention` in which a learned logit (an attention sink) joins every query's softmax as a key that holds
    no value: it takes its share of the probability and the outputs are the rest's. ``sinks`` is one logit per query
    head ([q_heads]: gpt-oss's, HY-V4's ``s_aux``) or one per head and query ([batch, q_heads, steps, 1]: Inkling 2's
    ``sinks``, projected from each token); ``bias`` is added to the scores first (broadcast to [batch, q_heads, steps,
    capacity]: Inkling 2's relative position bias). Plain operations in the graph (no ONNX ``Attention`` input takes
    sinks), as transformers' eager attention writes it: the mask added as the dtype's lowest, the largest logit
    subtracted before the softmax."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    sink = sinks.reshape(1, -1, 1, 1) if sinks.dim() == 1 else sinks
    sink = sink.to(scores.dtype).expand(*scores.shape[:-1], 1)
    scores = torch.cat([scores, sink], dim=-1)
    scores = scores - scores.amax(dim=-1, keepdim=True)
    return torch.matmul(torch.softmax(scores, dim=-1)[..., :-1], value)


def attention_unmasked(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of every query over every key (grouped key/value heads repeated), in plain operations: a model's
    attention call without a mask whose module is not causal (Inkling 2's attention over its block states, whose
    "heads" are the sequence's positions), as transformers' attention functions compute it without a mask."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    return torch.matmul(torch.softmax(scores, dim=-1), value)


#: The keyword arguments through which a model hands its attention sinks: one logit per head (``s_aux``: gpt-oss's,
#: HY-V4's) or per head and query (``sinks``: Inkling 2's).
SINKS = ("s_aux", "sinks")


#: Tensors a model may hand its attention function that change its values and that the step's attention does not
#: compute (ALiBi slopes; MiniMax-M3's key blocks chosen per query, which its own code expands into a mask only for
#: the eager and SDPA attentions): refused by name rather than dropped.
NOT_TAKEN = ("alibi", "head_mask", "block_indices")
#: Tensors the step's attention takes (:data:`SINKS`, DeepSeek sparse attention's ``indices``, the step's own
#: ``_past_length``), or that restate what its mask holds (positions, flash attention's packed-sequence offsets).
HANDED = (*SINKS, "indices", "_past_length", "position_ids", "cache_position", "cu_seq_lens_q", "cu_seq_lens_k")
_warned: set[tuple[str, str]] = set()


def check_handed(kwargs: dict[str, Any], module: torch.nn.Module) -> None:
    """An InputError for a tensor of :data:`NOT_TAKEN` among the ``kwargs`` a model hands its attention function; a
    warning (once per module type and name) for any other tensor the step's attention does not read, so that what it
    leaves out is said: the conversion's validation judges whether it mattered."""
    name = type(module).__name__
    refused = sorted(key for key in NOT_TAKEN if isinstance(kwargs.get(key), torch.Tensor))
    if refused:
        raise InputError(
            f"the step's attention does not compute the {', '.join(refused)} {name} hands its attention function "
            "(it would drop them)",
            fix=PLAIN_FORWARD,
        )
    for key in sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k not in HANDED):
        if (name, key) not in _warned:
            _warned.add((name, key))
            logger.warning("the step's attention does not read the %s %s hands it (validation judges it)", key, name)


def sinks_of(kwargs: dict[str, Any], query: torch.Tensor, module: torch.nn.Module) -> torch.Tensor | None:
    """The attention sinks the ``kwargs`` ``module`` hands its attention function hold ([q_heads] or
    [batch, q_heads, steps, 1]: see :func:`attention_with_sinks`), or None; a sink of another shape is refused by
    name, not dropped."""
    given = [(name, kwargs[name]) for name in SINKS if isinstance(kwargs.get(name), torch.Tensor)]
    if not given:
        return None
    if len(given) > 1:
        raise InputError(
            f"the step's attention takes one tensor of attention sinks, {type(module).__name__} hands s_aux and sinks",
            fix=PLAIN_FORWARD,
        )
    name, sinks = given[0]
    heads, steps = query.shape[1], query.shape[2]
    per_head = sinks.dim() == 1 and sinks.shape[0] == heads
    per_query = sinks.dim() == 4 and sinks.shape[1] == heads and sinks.shape[2] == steps and sinks.shape[3] == 1
    if not (per_head or per_query):
        raise InputError(
            f"the step's attention takes attention sinks per head [{heads}] or per head and query "
            f"[batch, {heads}, steps, 1], got {type(module).__name__}'s {name} of shape {tuple(sinks.shape)}",
            fix=PLAIN_FORWARD,
        )
    return sinks


def convert_kv_write(ctx: ConverterContext) -> gs.Tensor:
    """``TensorScatter`` along the sequence axis (-2), one write index per batch row (all equal)."""
    cache, update, position = ctx.input("cache"), ctx.input("update"), ctx.input("position")
    batch = ctx.op.Slice(ctx.op.Shape(cache), _ints(ctx, 0), _ints(ctx, 1))
    indices = ctx.op.Expand(ctx.op.Reshape(position, _ints(ctx, 1)), batch)
    return ctx.op.TensorScatter(cache, update, indices, axis=-2)


def convert_attention(ctx: ConverterContext) -> gs.Tensor:
    """ONNX ``Attention`` with the explicit boolean mask (``softcap`` only when the model uses it), or its
    decomposition when the generation settings ask for it (``attention="decomposed"``)."""
    generation = ctx.settings.generation
    if generation is not None and generation.attention == "decomposed":
        return _decomposed_attention(ctx)
    attrs: dict[str, float] = {"scale": float(ctx.attrs["scale"])}
    if float(ctx.attrs["softcap"]) > 0:
        attrs["softcap"] = float(ctx.attrs["softcap"])
    return ctx.op.Attention(ctx.input("query"), ctx.input("key"), ctx.input("value"), ctx.input("mask"), **attrs)


def convert_attention_biased(ctx: ConverterContext) -> gs.Tensor:
    """ONNX ``Attention`` with a float mask: the bias where the boolean mask is True, the type's lowest elsewhere
    (or the decomposition, with the bias added to the scores: asked for, or on TensorRT, whose attention layer
    TensorRT-RTX 1.7 neither runs with a float mask by a dedicated kernel for every head size nor decomposes right:
    its decomposition adds the float32 mask to float16 scores and fails, measured on T5's family)."""
    generation = ctx.settings.generation
    if generation is not None and (generation.attention == "decomposed" or on_tensorrt(ctx.settings)):
        return _decomposed_attention(ctx, bias=ctx.input("bias"))
    dtype = ctx.input_dtypes[0]
    lowest = ctx.constant(np.array(np.finfo(dtype).min, dtype))
    # in the query's type: ONNX types the mask apart from the query, TensorRT wants them alike (a float16 graph)
    additive = ctx.op.CastLike(ctx.op.Where(ctx.input("mask"), ctx.input("bias"), lowest), ctx.input("query"))
    scale = float(ctx.attrs["scale"])
    return ctx.op.Attention(ctx.input("query"), ctx.input("key"), ctx.input("value"), additive, scale=scale)


def on_tensorrt(settings: Settings) -> bool:
    """Whether the graph is built by TensorRT or TensorRT-RTX (the backend ``settings`` select)."""
    from pipeline.runtime.executors import select_backend

    return select_backend(settings.backend, settings, quiet=True).name in ("tensorrt", "tensorrt-rtx")


def _decomposed_attention(ctx: ConverterContext, bias: gs.Tensor | None = None) -> gs.Tensor:
    """``softmax(mask(q k^T * scale + bias)) v`` written out (:func:`passes.written_attention.written_out_attention`:
    grouped keys and values read once per KV head); the boolean mask has one head, the bias one or one per head."""
    dtype = ctx.input_dtypes[0]
    assert dtype is not None, "the generation ops' converters run on typed graphs"
    return written_out_attention(
        ctx,
        ctx.input("query"),
        ctx.input("key"),
        ctx.input("value"),
        scale=float(ctx.attrs["scale"]),
        dtype=dtype,
        bias=None if bias is None else ScoreTerm(bias, one_head=_one_head(ctx, bias)),
        mask=ScoreTerm(ctx.input("mask"), one_head=True),
        softcap=float(ctx.attrs.get("softcap", 0.0)),
    )


def _ints(ctx: ConverterContext, *values: int) -> gs.Constant:
    return ctx.constant(np.array(values, np.int64))


def generation_converters(registry: ConverterRegistry) -> ConverterRegistry:
    """A copy of ``registry`` with the converters of the two generation ops."""
    out = registry.copy()
    out.register("pipeline_generation::kv_write")(convert_kv_write)
    out.register("pipeline_generation::attention")(convert_attention)
    out.register("pipeline_generation::attention_biased")(convert_attention_biased)
    return out


def _one_head(ctx: ConverterContext, bias: gs.Tensor) -> bool:
    """Is ``bias`` [B or 1, 1, S, K] (one bias for every head: a cross-attended image mask), its head axis known as
    1? A bias per query head is folded like the queries instead."""
    shape = bias.shape
    return shape is not None and len(shape) == 4 and shape[1] == 1
