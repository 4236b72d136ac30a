"""The cached decoder step: a transformers causal LM called with a static cache whose layers are graph inputs.

:class:`CachedStep` wraps the model. Its ``forward(input_ids, attention_mask, position_ids, past_length,
**past_key_values)`` builds a transformers ``Cache`` whose layers hold the ``past_key_values.{i}.key/value`` inputs
([batch, kv_heads, capacity, head_dim]); the model's own ``cache.update`` calls write through
``pipeline_generation::kv_write`` (ONNX ``TensorScatter``) and return the whole static cache, and the model's
attention (when it dispatches through transformers' ``AttentionInterface``) runs as
``pipeline_generation::attention`` (ONNX ``Attention``, :mod:`.step_attention`) with the boolean mask transformers
builds from the positions and ``attention_mask``. Nothing here reads one architecture's code: the model decides where
its cache is written and how its mask looks (sliding windows included); this module only supplies the storage and
the kernel.
The step returns ``logits`` of the last position and ``present.{i}.key/value``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, DynamicCache

from pipeline.generation import ops
from pipeline.generation.step_attention import (
    ATTENTION_NAME,
    attention_implementation,
    causal_step_mask,
    register_attention,
)
from pipeline.runtime.generation.layout import INDEXER, past_name, present_name


class StepCacheLayer(CacheLayerMixin):
    """One layer's static cache, holding graph inputs; ``update`` writes functionally (a new tensor, which the
    graph returns as ``present``) at ``past_length``."""

    is_compileable = False  # keeps transformers from specialising the mask on a query length of 1 during export
    is_sliding = False

    keys: torch.Tensor
    values: torch.Tensor

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        past_length: torch.Tensor,
        length: Any = None,
        written_only: bool = False,
    ) -> None:
        super().__init__()
        self.keys, self.values = keys, values
        self.past_length = past_length
        #: the length as a number (``CachedStep.own_mask``, ``written_only``), else None: the 0-d tensor ``past_length``
        self.length = length
        #: the model is handed the positions written so far (this step's included), a view of the static cache,
        #: instead of the whole capacity: attention code of the model's own that masks no cache position (GPT-Neo's
        #: local window, FSMT's and LED's over one decoder token) then attends to what transformers' growing cache
        #: holds. The static cache is still written in place and returned whole (``present``): the runtime does not
        #: change. Needs ``length`` as a number.
        self.written_only = written_only
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the storage is the step's inputs."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Write the step's keys and values at ``past_length``; the whole static cache back (or its written part)."""
        self.keys = ops.kv_write(self.keys, _as_type(key_states, self.keys.dtype), self.past_length)
        self.values = ops.kv_write(self.values, _as_type(value_states, self.values.dtype), self.past_length)
        if self.written_only:
            end = self.length + key_states.shape[-2]
            return self.keys[:, :, :end], self.values[:, :, :end]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[Any, int]:
        """The mask spans the whole capacity from position 0 (the written positions when ``written_only``)."""
        return (self.length + query_length if self.written_only else int(self.keys.shape[-2])), 0

    def get_seq_length(self) -> Any:
        """The number of positions written before this step (a 0-d tensor: the query offset of the mask; a number
        for a model that builds its own mask from it)."""
        return self.past_length if self.length is None else self.length

    def get_max_length(self) -> int:
        """The capacity."""
        return int(self.keys.shape[-2])


class StepIndexedLayer(StepCacheLayer):
    """:class:`StepCacheLayer` of an indexed attention layer (DeepSeek sparse attention), which also caches its
    indexer's keys: ``update_indexer`` writes them at ``past_length`` into ``indexer`` [batch, 1, capacity, dim] (a
    one-head key cache: the same write) and returns the whole static cache [batch, capacity, dim], as transformers'
    ``StaticIndexedLayer`` does. The indexer ranks every position of the capacity; the ones the mask hides score
    -inf, so its top-k picks among the written positions as over transformers' dynamic cache. ``writes`` are the
    names the model's own cache layer writes them by (MiniMax-M3's ``update_index`` hands them [batch, 1, steps,
    dim] and takes the cache back so): each answers with :meth:`update_indexer`."""

    #: positions the indexer's keys were computed at (transformers' optional field; this cache keeps none)
    indexer_position_ids = None

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        indexer: torch.Tensor,
        past_length: torch.Tensor,
        length: Any,
        writes: Sequence[str] = (),
    ) -> None:
        super().__init__(keys, values, past_length, length)
        self.indexer = indexer
        for name in writes:
            setattr(self, name, self.update_indexer)

    def update_indexer(self, indexer_key_states: torch.Tensor) -> torch.Tensor:
        """Write the step's indexer keys [batch, steps, dim] (or [batch, 1, steps, dim]) at ``past_length``; the whole
        static cache comes back in the same form."""
        one_head = indexer_key_states.dim() == 4
        written = _as_type(indexer_key_states, self.indexer.dtype)
        self.indexer = ops.kv_write(self.indexer, written if one_head else written.unsqueeze(1), self.past_length)
        return self.indexer if one_head else self.indexer.squeeze(1)


class StepCache(Cache):
    """A transformers ``Cache`` of :class:`StepCacheLayer`, one per decoder layer (``shared``: the decoder layers that
    keep no cache of their own, transformers' ``DummyLayer`` in their place)."""

    def __init__(self, layers: list[StepCacheLayer], shared: Sequence[int] = ()) -> None:
        super().__init__(layers=with_shared_layers(list(layers), shared))


def with_shared_layers(layers: list[Any], shared: Sequence[int]) -> list[Any]:
    """The cache layers of every decoder layer: ``layers`` (those that keep a cache, in order) with a transformers
    ``DummyLayer`` at each index of ``shared``."""
    cached = iter(layers)
    return [DummyLayer() if i in shared else next(cached) for i in range(len(layers) + len(shared))]


def shared_cache_layers(model: torch.nn.Module, cached: int) -> tuple[int, ...]:
    """The decoder layers of ``model`` that keep no cache of their own: those that reuse an earlier layer's keys and
    values (Gemma 3n's and Gemma 4's KV sharing: the last ``num_kv_shared_layers``), which the cache transformers
    builds from the model's config holds as a ``DummyLayer``. They take no cache inputs: the step's
    ``past_key_values.{i}`` count the ``cached`` layers that keep one (none is shared unless the config's cache holds
    as many others)."""
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(config, "get_text_config", None)):
        return ()
    try:
        cache = DynamicCache(config=config)
    except Exception:  # noqa: BLE001 - a config transformers builds no cache from: every layer keeps its own
        return ()
    shared = tuple(i for i, layer in enumerate(cache.layers) if isinstance(layer, DummyLayer))
    return shared if len(cache.layers) == cached + len(shared) else ()


def indexed_layers(layout: Sequence[Any]) -> dict[int, tuple[str, ...]]:
    """The layers of a cache ``layout`` that also cache an indexer's keys (``CachedLayer.indexer_dim``), each with
    the names of the methods that write them (``CachedLayer.indexer_writes``)."""
    return {i: layer.indexer_writes for i, layer in enumerate(layout) if getattr(layer, "indexer_dim", 0)}


def _as_type(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype``; not converted when it is already (the export would trace a no-op ``to`` and its
    dtype assertion, in every layer)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


class CachedStep(torch.nn.Module):
    """One decoder step of ``model`` over a static cache (see the module docstring).

    ``forward(input_ids [B, S], attention_mask [B, capacity], position_ids [B, S], past_length [] int64, *past)``
    with ``past`` each layer's key and value caches [B, kv_heads, capacity, dim] in layer order (graph inputs
    ``past_key_values.{i}.key/value``: :attr:`onnx_input_names`) returns ``{"logits": [B, vocab] of the last
    position, "present.{i}.key": ..., ...}``."""

    #: The cache says it is not initialized, so that a model builds the masks of its first call: PaliGemma's
    #: bidirectional prefix reads ``token_type_ids`` only then (a vision-language step that takes them sets it).
    prefill_masks = False
    #: Added to the ``position_ids`` the model is handed: where the positions it computes itself over a whole
    #: sequence start from (Kosmos-2's, from its padding token's id on, when its ``generate`` runs without a cache).
    #: None: the model is handed none, and computes its own from its tokens and the cache's length (Kosmos-2's
    #: ``generate`` with a cache); the step's ``position_ids`` input is then unused.
    position_offset: int | None = 0
    #: The model builds its own additive mask over the keys it has seen (past and new, Kosmos-2's), which the static
    #: cache's capacity does not match: it is handed no ``attention_mask`` and the cache's length as a number, and its
    #: attention takes the step's mask instead (causal, over the written positions ``attention_mask`` keeps).
    own_mask = False
    #: The model is handed the written cache positions only, not the capacity (:mod:`.decoder_static_check`: GPT-Neo's).
    written_only = False

    def __init__(
        self,
        model: torch.nn.Module,
        layers: int,
        use_interface: bool,
        indexed: Mapping[int, Sequence[str]] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.layers = layers
        #: the cached layers that also cache their indexer's keys (:class:`StepIndexedLayer`), with the names of the
        #: model's cache-layer methods that write them
        self.indexed = dict(indexed or {})
        #: the decoder layers that keep no cache (:func:`shared_cache_layers`), not counted in ``layers``
        self.shared = shared_cache_layers(model, layers)
        self.use_interface = use_interface
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in parameters
        if use_interface:
            register_attention()
        #: graph input names of the ``*past`` arguments (the exporter reads this mapping)
        self.onnx_input_names = {f"past_{j}": name for j, name in enumerate(self.cache_names())}

    def cache_names(self) -> list[str]:
        """The cache inputs' names in order: each layer's keys and values (and :data:`INDEXER` keys)."""
        kinds = ("key", "value")
        return [past_name(i, k) for i in range(self.layers) for k in (*kinds, *([INDEXER] * (i in self.indexed)))]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_length: torch.Tensor,
        *past: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """The step: logits of the last position and the updated cache."""
        return self.run({"input_ids": input_ids}, attention_mask, position_ids, past_length, past)

    def run(
        self,
        tokens: dict[str, Any],
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_length: torch.Tensor,
        past: Sequence[torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """The model called on ``tokens`` (its ``input_ids``, or ``inputs_embeds`` a subclass computed) with the
        static cache updated in place: :func:`step_outputs`."""
        length, steps = None, position_ids.shape[-1]
        if self.own_mask or self.written_only:
            steps = next(iter(tokens.values())).shape[1]  # the model's own size (input_ids'), not the positions'
            length = past_length.item()
            torch._check(length >= 0)
            torch._check(length + steps <= past[0].shape[-2])
            if self.own_mask and torch.compiler.is_exporting():
                # the model's branches on its cache's length (Kosmos-2's `if cache_length > 0`) are traced on their
                # general side, a cache holding positions, whose numbers at a prefill (length 0) are the same (no
                # columns of past keys): the graph is one for both. Only the trace assumes it (the graph holds no
                # assertion of it); validation runs the prefill at length 0
                torch._check(length >= 1)
        layers = self.cache_layers(past, past_length, length)
        if self.prefill_masks:  # the model's first-call masks apply (its decode steps' inputs make them no-ops)
            for layer in layers:
                layer.is_initialized = False
        mask = None if self.own_mask else self.model_mask(attention_mask, past_length, steps)
        call: dict[str, Any] = {
            **tokens,
            "attention_mask": mask if mask is None or length is None else mask[:, : length + steps],  # written_only
            self._cache_argument: self.cache(layers),
            "use_cache": True,
        }
        if self.position_offset is not None:
            call["position_ids"] = position_ids + self.position_offset if self.position_offset else position_ids
        if self._logits_to_keep:
            call["logits_to_keep"] = 1
        if self.use_interface:
            call["_past_length"] = past_length
            if self.own_mask:
                call["_step_mask"] = causal_step_mask(attention_mask, past_length, steps)
        with attention_implementation(self.model, ATTENTION_NAME if self.use_interface else None):
            out = self.model(**call)
        return self.outputs(out.logits, layers)

    def outputs(self, logits: torch.Tensor, layers: list[Any]) -> dict[str, torch.Tensor]:
        """What the step returns (:func:`step_outputs`)."""
        return step_outputs(logits, layers)

    def cache_layers(self, past: Sequence[torch.Tensor], past_length: torch.Tensor, length: Any) -> list[Any]:
        """The cache layers over the step's ``past`` inputs (a subclass with other cache tensors builds its own)."""
        tensors = iter(past)
        layers: list[StepCacheLayer] = []
        for i in range(self.layers):
            keys, values = next(tensors), next(tensors)
            if i in self.indexed:
                indexer = next(tensors)
                layers.append(StepIndexedLayer(keys, values, indexer, past_length, length, self.indexed[i]))
            else:
                layers.append(StepCacheLayer(keys, values, past_length, length, self.written_only))
        return layers

    def cache(self, layers: list[Any]) -> Cache:
        """The transformers ``Cache`` the model is handed."""
        return StepCache(layers, self.shared)

    def model_mask(self, attention_mask: torch.Tensor, past_length: torch.Tensor, steps: int) -> torch.Tensor:
        """The 2-D ``attention_mask`` the model is handed: the step's, over the cache's capacity."""
        return attention_mask


def step_outputs(logits: torch.Tensor, layers: Sequence[StepCacheLayer]) -> dict[str, torch.Tensor]:
    """What a step returns: the logits of the last position [B, vocab] and every layer's whole static cache, as
    ``present.{i}.key/value``."""
    result = {"logits": logits[:, -1, :]}
    for i, layer in enumerate(layers):
        result[present_name(i, "key")] = layer.keys
        result[present_name(i, "value")] = layer.values
        if isinstance(layer, StepIndexedLayer):
            result[present_name(i, INDEXER)] = layer.indexer
    return result
