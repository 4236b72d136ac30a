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

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.context import ConverterContext
from converters.registry import ConverterRegistry

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
    is True; ``softcap`` > 0 caps the scores as ``softcap * tanh(scores / softcap)`` (Gemma 2)."""
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


def convert_kv_write(ctx: ConverterContext) -> gs.Tensor:
    """``TensorScatter`` along the sequence axis (-2), one write index per batch row (all equal)."""
    cache, update, position = ctx.input("cache"), ctx.input("update"), ctx.input("position")
    batch = ctx.op.Slice(
        ctx.op.Shape(cache), ctx.constant(np.array([0], np.int64)), ctx.constant(np.array([1], np.int64))
    )
    indices = ctx.op.Expand(ctx.op.Reshape(position, ctx.constant(np.array([1], np.int64))), batch)
    return ctx.op.TensorScatter(cache, update, indices, axis=-2)


def convert_attention(ctx: ConverterContext) -> gs.Tensor:
    """ONNX ``Attention`` with the explicit boolean mask; ``softcap`` only when the model uses it (TensorRT's
    parser does not take the attribute)."""
    attrs: dict[str, float] = {"scale": float(ctx.attrs["scale"])}
    if float(ctx.attrs["softcap"]) > 0:
        attrs["softcap"] = float(ctx.attrs["softcap"])
    return ctx.op.Attention(ctx.input("query"), ctx.input("key"), ctx.input("value"), ctx.input("mask"), **attrs)


def generation_converters(registry: ConverterRegistry) -> ConverterRegistry:
    """A copy of ``registry`` with the converters of the two generation ops."""
    out = registry.copy()
    out.register("pipeline_generation::kv_write")(convert_kv_write)
    out.register("pipeline_generation::attention")(convert_attention)
    return out
