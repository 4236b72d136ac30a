"""The model's cache as the step holds it: each cached layer's heads, key and value widths and dtype (and its indexer's
keys, or its recurrent states), read from the cache the model itself builds on two tokens (:func:`model_cache_layout`,
:func:`layout_of`): the number and shapes of the step's cache inputs. No architecture's code is read; a cache the step
cannot hold is an InputError naming the layer.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
from transformers.cache_utils import (
    DummyLayer,
    DynamicLayer,
    EncoderDecoderCache,
    LinearAttentionCacheLayerMixin,
    StaticLayer,
)

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.kept_windows import OWN, kept_elsewhere, kept_window
from pipeline.generation.recurrent_state import FirstCallCache, StateLayer, holds_states
from pipeline.runtime.generation.layout import CachedLayer
from pipeline.runtime.io_spec import is_model_cache


def cache_argument(model: torch.nn.Module) -> str:
    """The name the model's forward takes its cache by (``cache``, or the older ``past_key_values``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def model_cache_layout(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[list[Any], int]:
    """(kv_heads, head_dim, dtype) of every cached layer, read from the cache the model builds on two tokens, and
    the vocabulary (the width of the logits of that run). The caller checks its layer kinds first
    (:func:`~pipeline.generation.conversion.check_attention_layers`)."""
    try:
        with torch.no_grad():
            try:
                out = model(input_ids=input_ids[:1, :2], use_cache=True)
            except Exception:  # noqa: BLE001 - once more with an empty cache handed in, as generate hands one
                # a cache of linear-attention layers alone (a small config's) asks an attention layer its length
                out = model(
                    input_ids=input_ids[:1, :2],
                    use_cache=True,
                    **{cache_argument(model): FirstCallCache(config=getattr(model, "config", None))},
                )
    except Exception as error:  # noqa: BLE001 - the model refusing a text-only call: said with its cause
        raise InputError(
            f"{type(model).__name__} fails on two tokens of the prompt alone (input_ids [1, 2], use_cache=True): "
            f"{type(error).__name__}: {' '.join(str(error).split())[:300]}",
            fix="generation= converts causal LMs (a decoder that takes token ids and caches keys and values), "
            "encoder-decoders and vision-language decoders with get_image_features; convert without generation= "
            "for the plain forward",
        ) from error
    return layout_of(model, out, states=True)


def indexer_keys(
    layer: Any, keys: torch.Tensor, where: str, kept: tuple[str, ...] = OWN
) -> tuple[torch.Tensor | None, tuple[str, ...]]:
    """The indexer keys an indexed attention layer's cache holds beside its keys and values, and the names of the
    methods its class adds that write them: DeepSeek sparse attention's ``indexer_keys`` [batch, tokens, width]
    (``update_indexer``), MiniMax-M3's block indexer's [batch, 1, tokens, width] (``update_index``). Found as what
    they are: a floating tensor over the keys' tokens, written by an ``update*`` method the layer's class adds to
    transformers' layers. (None, ()) for a plain layer; an InputError for any other tensor the layer keeps, which the
    step would not carry from one step to the next."""
    extra = {
        name: value
        for name, value in vars(layer).items()
        if name not in (*OWN, *kept) and isinstance(value, torch.Tensor) and value.is_floating_point()
    }
    if not extra:
        return None, ()
    base = {name for kind in (DynamicLayer, StaticLayer) for name in dir(kind)}
    writes = tuple(
        name for name in dir(type(layer)) if name.startswith("update") and name not in base and name != "update"
    )
    if len(extra) == 1 and writes:
        name, tensor = next(iter(extra.items()))
        over_tokens = tensor.dim() in (3, 4) and tensor.shape[-2] == keys.shape[-2] and tensor.shape[0] == keys.shape[0]
        if over_tokens and (tensor.dim() == 3 or tensor.shape[1] == 1) and tensor.dtype == keys.dtype:
            return tensor, writes
        raise InputError(
            f"{where} holds {name} {tuple(tensor.shape)} ({tensor.dtype}) beside its keys {tuple(keys.shape)}: not "
            "an indexer's one-head key cache [batch, (1,) tokens, width] in the keys' dtype",
            fix=PLAIN_FORWARD,
        )
    raise InputError(
        f"{where} is a {type(layer).__name__} that keeps {', '.join(sorted(extra))} beside its keys and values "
        f"(written by {', '.join(writes) or 'no update method of its own'}): the step would not carry "
        f"{'them' if len(extra) > 1 else 'it'} from one token to the next",
        fix=PLAIN_FORWARD,
    )


def layout_of(model: torch.nn.Module, out: Any, states: bool = False) -> tuple[list[Any], int]:
    """The heads, key and value widths and dtype of every cached layer of the cache in ``out`` (the model's output with
    ``use_cache=True``) and the vocabulary (the width of its logits); an InputError for a cache the step cannot
    hold. ``states``: a layer with recurrent states is a :class:`~pipeline.generation.recurrent_state.StateLayer`
    (a causal LM's step), else refused."""
    cache: Any = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if not is_model_cache(cache):
        encoder = getattr(getattr(model, "config", None), "is_decoder", None) is False
        raise InputError(
            f"{type(model).__name__} returned no transformers Cache with use_cache=True (got "
            f"{type(cache).__name__}); generation= needs a model that caches keys and values"
            + ("; its config says is_decoder=False (an encoder: it caches nothing)" if encoder else ""),
            fix=(
                f"build or load it as a decoder, {type(model).__name__}.from_pretrained(..., is_decoder=True) (or "
                "config.is_decoder = True before the model is made), as transformers asks for causal-LM use"
                if encoder
                else f"{PLAIN_FORWARD}, or use a model on transformers' Cache API"
            ),
        )
    if isinstance(cache, EncoderDecoderCache) and not any(
        isinstance(layer, DynamicLayer) and layer.is_initialized for layer in cache.cross_attention_cache.layers
    ):  # a decoder that makes an encoder-decoder cache whatever it is called with (MegatronBERT's, RemBERT's): its
        # self-attention half is the cache; handed a plain one, its layers use it as it is
        cache = cache.self_attention_cache
    layout: list[Any] = []
    # beside layers with recurrent states a DummyLayer is a layer without a cache (a hybrid stack's MLP: Nemotron-H's),
    # which keeps its place; else it reuses an earlier layer's keys and values (KV sharing: Gemma 3n's)
    hybrid = states and any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, DummyLayer) and not hybrid:  # no cache of its own
            continue
        if states and holds_states(layer):
            layout.append(StateLayer.of(i, layer, type(model).__name__))
            continue
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        kept = OWN
        if isinstance(keys, torch.Tensor) and keys.dim() != 4:  # kept under names of its own (kept_windows)
            keys, values, kept = kept_elsewhere(layer)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor) or keys.dim() != 4:
            raise InputError(
                f"cache layer {i} of {type(model).__name__} is a {type(layer).__name__} without 4-D keys/values "
                "(linear attention or a state-space layer)",
                fix="generation= supports attention caches [batch, heads, tokens, dim]; convert without it",
            )
        if values.shape[1] != keys.shape[1] or values.dtype != keys.dtype:
            raise InputError(
                f"cache layer {i} of {type(model).__name__} holds keys of {keys.shape[1]} heads ({keys.dtype}) but "
                f"values of {values.shape[1]} ({values.dtype})",
                fix="generation= supports caches whose keys and values have the same heads and dtype",
            )
        indexer, writes = indexer_keys(layer, keys, f"cache layer {i} of {type(model).__name__}", kept)
        window = kept_window(layer) if kept != OWN else 0
        layout.append(dataclasses.replace(CachedLayer.of(keys, values, indexer, writes), window=window))
    recurrent = any(isinstance(layer, StateLayer) for layer in layout)
    if recurrent and any(getattr(layer, "indexer_dim", 0) for layer in layout):
        raise InputError(
            f"{type(model).__name__} has indexed attention layers beside layers with recurrent states: generation= "
            "caches either, not both in one model",
            fix=PLAIN_FORWARD,
        )
    logits = getattr(out, "logits", None)
    vocabulary = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(logits, torch.Tensor) and logits.dim() >= 1:
        vocabulary = int(logits.shape[-1])  # what the step returns: the config may pad or omit it
    return layout, int(vocabulary or 0)
