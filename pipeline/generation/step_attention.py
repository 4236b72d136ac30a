"""The step's attention through transformers' ``AttentionInterface``: the kernel the cached step hands the model.

A model whose attention dispatches through transformers' ``AttentionInterface`` (:func:`uses_attention_interface`)
runs, inside the step, :func:`step_attention` (``pipeline_generation::attention``: ONNX ``Attention``, or plain
operations where the model adds a position bias or attention sinks) over the static cache, with the boolean mask
:func:`step_mask` builds (transformers' own SDPA mask in which every query also sees its own position, so that padding
rows stay finite). Masks built here are marked (while they live) so that the attention knows what it was handed:
a causal mask that already lets each query see itself, a bidirectional one (an encoder-decoder's cross-attention), or
cross-attention keys (:func:`mark_cross`). :func:`register_attention` registers both under :data:`ATTENTION_NAME`;
:func:`attention_implementation` switches a model (and every sub-config) to it for one call.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD, ops

#: The name the step's attention and mask functions are registered under in transformers' interfaces.
ATTENTION_NAME = "pipeline_generation"

logger = logging.getLogger(__name__)

#: The masks :func:`step_mask` built (by ``id``, while they live), which already let every query see its own
#: position, so that ``step_attention`` adds nothing: built once per step, they spare every layer the same
#: comparison (and the export its trace). Not a WeakSet: its lookup compares live tensors with ``==``.
_SELF_ATTENDING: dict[int, weakref.ref[torch.Tensor]] = {}
#: The bidirectional masks :func:`step_mask` built (an encoder-decoder's cross-attention over the encoder's tokens):
#: used as they are, since their queries are not positions among the keys.
_BIDIRECTIONAL: dict[int, weakref.ref[torch.Tensor]] = {}


#: The cross-attention keys an encoder-decoder's step was given (:func:`mark_cross`): attention over them without a
#: mask (Whisper passes none) attends to every one.
_CROSS: dict[int, weakref.ref[torch.Tensor]] = {}


def mark_cross(keys: torch.Tensor) -> None:
    """Mark ``keys`` as cross-attention keys over the encoder's tokens (see :func:`step_attention`)."""
    _mark(_CROSS, keys)


def _mark(registry: dict[int, weakref.ref[torch.Tensor]], mask: torch.Tensor) -> None:
    key = id(mask)
    registry[key] = weakref.ref(mask, lambda _: registry.pop(key, None))


def _is_marked(registry: dict[int, weakref.ref[torch.Tensor]], mask: torch.Tensor) -> bool:
    kept = registry.get(id(mask))
    return kept is not None and kept() is mask


def step_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """transformers' boolean SDPA mask, always built (never skipped for ``is_causal``: the step's query is not
    aligned with the start of the keys), in which every query of a causal mask also sees its own position (see
    :func:`step_attention`). A bidirectional mask (``create_bidirectional_mask``: an encoder-decoder's
    cross-attention) is built as transformers builds it, never skipped either."""
    kwargs["allow_is_causal_skip"] = False
    if "allow_is_bidirectional_skip" in kwargs:  # only create_bidirectional_mask passes it
        kwargs["allow_is_bidirectional_skip"] = False
        mask = sdpa_mask(*args, **kwargs)
        if isinstance(mask, torch.Tensor):
            _mark(_BIDIRECTIONAL, mask)
        return mask
    mask = sdpa_mask(*args, **kwargs)
    q_length, kv_length, q_offset, kv_offset = (
        kwargs.get(name) for name in ("q_length", "kv_length", "q_offset", "kv_offset")
    )
    if (
        not isinstance(mask, torch.Tensor)
        or mask.dtype != torch.bool
        or mask.dim() != 4
        or q_length is None
        or kv_length is None
        or q_offset is None
        or kv_offset is None
    ):
        return mask
    queries = torch.arange(q_length, device=mask.device) + q_offset
    keys = torch.arange(kv_length, device=mask.device) + kv_offset
    mask = mask | (keys.view(1, 1, 1, -1) == queries.view(1, 1, -1, 1))
    _mark(_SELF_ATTENDING, mask)
    return mask


def step_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    softcap: float | None = None,
    position_bias: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` function of the step: ``pipeline_generation::attention`` over the static cache
    (``attention_biased`` with a model's additive ``position_bias``: T5's relative positions; plain operations with
    attention sinks, :func:`ops.attention_with_sinks`, or without a mask in a module that is not causal).

    Every query of a causal mask also attends to its own position, so that the rows of padding tokens (masked
    everywhere else) stay finite: their outputs are never attended to, but a NaN there would reach later layers'
    cache entries. A mask :func:`step_mask` built has that already; in another one (the model's own, or one it cut
    from the step's), a query that sees no key gets it here. A bidirectional mask (cross-attention) is used as it is;
    cross-attention without one attends to every key, as does a module that is not causal."""
    own = kwargs.pop("_step_mask", None)
    if isinstance(own, torch.Tensor) and (attention_mask is None or attention_mask.is_floating_point()):
        attention_mask = own  # the model's own additive mask over the keys it has seen: the step's over the cache
    if isinstance(attention_mask, torch.Tensor) and attention_mask.is_floating_point() and position_bias is None:
        # an additive mask made from the step's (Doge's: a bias per key, the dtype's minimum where masked): the bias,
        # and a one-head mask of the keys any head keeps (a key another head drops keeps its minimum there as bias)
        position_bias = attention_mask
        attention_mask = (attention_mask > torch.finfo(attention_mask.dtype).min / 2).any(dim=1, keepdim=True)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    if attention_mask is None and _is_marked(_CROSS, key):
        attention_mask = torch.ones(1, 1, query.shape[2], key.shape[2], dtype=torch.bool, device=query.device)
        _mark(_BIDIRECTIONAL, attention_mask)
    ops.check_handed(kwargs, module)  # a tensor it would drop refused by name, one it does not read said
    plain = position_bias is None and not softcap and ops.sinks_of(kwargs, query, module) is None  # else refused below
    if attention_mask is None and plain and not kwargs.get("is_causal", getattr(module, "is_causal", True)):
        # every key, as transformers' attention functions do (Inkling 2's attention over its block states)
        return ops.attention_unmasked(query, key, value, scale).transpose(1, 2).contiguous(), None
    if attention_mask is None or attention_mask.dtype != torch.bool:
        got = "none" if attention_mask is None else f"a {attention_mask.dtype} one"
        raise InputError(
            f"the step's attention in {type(module).__name__} needs a boolean mask over the cache, got {got}",
            fix=PLAIN_FORWARD,
        )
    indices = kwargs.get("indices")
    if isinstance(indices, torch.Tensor):  # DeepSeek sparse attention's top-k keys per query [B, steps, k]: only them
        chosen = torch.zeros(*indices.shape[:-1], key.shape[2], dtype=torch.bool, device=key.device)
        attention_mask = attention_mask & chosen.scatter(-1, indices.long(), True).unsqueeze(1)
    past = kwargs.get("_past_length")
    steps, capacity = query.shape[2], key.shape[2]
    own_missing = not _is_marked(_SELF_ATTENDING, attention_mask) and not _is_marked(_BIDIRECTIONAL, attention_mask)
    if isinstance(past, torch.Tensor) and own_missing:
        # only a query that sees no key gets its own position: a mask the model cut from the step's (Gemma 4's last
        # query alone through its KV-sharing layers) is another tensor, whose queries are not the step's first ones
        own = torch.arange(capacity).view(1, 1, 1, capacity) == (torch.arange(steps) + past).view(1, 1, steps, 1)
        attention_mask = attention_mask | (own & ~attention_mask.any(-1, keepdim=True))
    sinks = ops.sinks_of(kwargs, query, module)
    if sinks is not None:  # attention sinks (gpt-oss's, HY-V4's, Inkling 2's): plain operations, no ONNX Attention
        if softcap:
            raise InputError(
                f"the step's attention in {type(module).__name__} takes attention sinks or a softcap, not both",
                fix=PLAIN_FORWARD,
            )
        bias = None if position_bias is None else position_bias.to(query.dtype)
        out = ops.attention_with_sinks(query, key, value, attention_mask, scale, sinks, bias)
        return out.transpose(1, 2).contiguous(), None
    if position_bias is not None:
        if softcap:
            raise InputError(
                f"the step's attention in {type(module).__name__} takes a position bias or a softcap, not both",
                fix=PLAIN_FORWARD,
            )
        out = ops.attention_biased(query, key, value, attention_mask, position_bias.to(query.dtype), scale)
        return out.transpose(1, 2).contiguous(), None
    out = ops.attention(query, key, value, attention_mask, scale, float(softcap or 0.0))
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Register the step's attention and mask functions with transformers (idempotent)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # imports the vision stack: only when used

    ALL_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, step_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, step_mask)


def uses_attention_interface(model: torch.nn.Module, otherwise: str | None = None) -> bool:
    """Whether the model's attention dispatches through transformers' ``AttentionInterface`` (then the step's
    attention is ONNX ``Attention``; otherwise the model's own attention code is exported as it is). When it does not
    and ``otherwise`` says what that means for the caller's graph, a warning says so."""
    can = getattr(model, "_can_set_attn_implementation", None)
    try:
        uses = bool(can()) if callable(can) else False
    except Exception:  # noqa: BLE001 - transformers' probe reads the model's source; unreadable means no
        uses = False
    if not uses and otherwise is not None:
        logger.warning(
            "%s does not dispatch its attention through transformers' AttentionInterface: %s",
            type(model).__name__,
            otherwise,
        )
    return uses


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, name: str | None) -> Iterator[None]:
    """Run the block with ``_attn_implementation`` set to ``name`` (None: unchanged) in the config of the model and of
    every submodule with its own (T5's encoder and decoder stacks hold copies), then restore."""
    if name is None:
        yield
        return
    configs: dict[int, Any] = {id(model.config): model.config}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            configs.setdefault(id(config), config)
    previous = {key: config._attn_implementation for key, config in configs.items()}
    for config in configs.values():
        config._attn_implementation = name
    try:
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = previous[key]


def causal_step_mask(attention_mask: torch.Tensor, past_length: torch.Tensor, steps: int) -> torch.Tensor:
    """The boolean mask [B, 1, steps, capacity] of a causal step over the static cache: a query sees the written keys
    ``attention_mask`` keeps up to its own position, and its own position (see :func:`step_attention`)."""
    capacity = attention_mask.shape[-1]
    keys = torch.arange(capacity, device=attention_mask.device).view(1, 1, 1, capacity)
    queries = (torch.arange(steps, device=attention_mask.device) + past_length).view(1, 1, steps, 1)
    mask = (attention_mask.view(-1, 1, 1, capacity) != 0) & (keys <= queries)
    mask = mask | (keys == queries)
    _mark(_SELF_ATTENDING, mask)
    return mask
