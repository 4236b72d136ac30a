"""The cached decoder step: a transformers causal LM called with a static cache whose layers are graph inputs.

:class:`CachedStep` wraps the model. Its ``forward(input_ids, attention_mask, position_ids, past_length,
**past_key_values)`` builds a transformers ``Cache`` whose layers hold the ``past_key_values.{i}.key/value`` inputs
([batch, kv_heads, capacity, head_dim]); the model's own ``cache.update`` calls write through
``pipeline_generation::kv_write`` (ONNX ``TensorScatter``) and return the whole static cache, and the model's
attention (when it dispatches through transformers' ``AttentionInterface``) runs as
``pipeline_generation::attention`` (ONNX ``Attention``) with the boolean mask transformers builds from the
positions and ``attention_mask``. Nothing here reads one architecture's code: the model decides where its cache is
written and how its mask looks (sliding windows included); this module only supplies the storage and the kernel.
The step returns ``logits`` of the last position and ``present.{i}.key/value``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, DynamicCache
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD, ops
from pipeline.runtime.generation.layout import INDEXER, past_name, present_name

#: The name the step's attention and mask functions are registered under in transformers' interfaces.
ATTENTION_NAME = "pipeline_generation"

logger = logging.getLogger(__name__)


class StepCacheLayer(CacheLayerMixin):
    """One layer's static cache, holding graph inputs; ``update`` writes functionally (a new tensor, which the
    graph returns as ``present``) at ``past_length``."""

    is_compileable = False  # keeps transformers from specialising the mask on a query length of 1 during export
    is_sliding = False
    written_only = False  # the model is handed the positions written so far (:attr:`CachedStep.written_only`)

    keys: torch.Tensor
    values: torch.Tensor

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, past_length: torch.Tensor, length: Any = None) -> None:
        super().__init__()
        self.keys, self.values = keys, values
        self.past_length = past_length
        #: the length as a number (``CachedStep.own_mask``, ``written_only``), else None: the 0-d tensor ``past_length``
        self.length = length
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
                layers.append(StepCacheLayer(keys, values, past_length, length))
                layers[-1].written_only = self.written_only
        return layers

    def cache(self, layers: list[Any]) -> Cache:
        """The transformers ``Cache`` the model is handed."""
        return StepCache(layers, self.shared)

    def model_mask(self, attention_mask: torch.Tensor, past_length: torch.Tensor, steps: int) -> torch.Tensor:
        """The 2-D ``attention_mask`` the model is handed: the step's, over the cache's capacity."""
        return attention_mask


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
