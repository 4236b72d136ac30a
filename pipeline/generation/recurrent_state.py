"""The cached step of a model whose cache layers keep a recurrent state: linear attention, short convolutions,
state-space (Mamba) layers, alone or beside attention in one layer.

transformers' linear-attention cache layers (``LinearAttentionCacheLayerMixin``) hold, per state index, a
``conv_states`` tensor (the last ``kernel`` inputs of a causal convolution, [batch, channels, kernel]) and a
``recurrent_states`` tensor (fixed size, batch first). The step takes each as a graph input and returns the new one:
``past_key_values.{i}.conv`` / ``present.{i}.conv`` and ``past_key_values.{i}.recurrent`` / ``present.{i}.recurrent``
(a further state index ``s``: ``conv_{s}``, ``recurrent_{s}``), after the layer's keys and values when it has them.

One graph of one token serves the prompt and the decode steps (``max_prompt`` is 1: the decoding loop feeds a prompt
token by token). A model's multi-token path cannot be exported with a dynamic sequence: its chunked scans loop over
``ceil(tokens / chunk)`` chunks in Python, a count the export cannot keep symbolic; its one-token path is the
recurrence itself, the fastest decode step, and exactly what a prompt fed token by token needs. The cache always says
it holds a previous state (``has_previous_state``): zeros before the first token, which is what a state started
from nothing is. A model masks the padding of a multi-token call only (transformers' recurrent mask is None for one
token), so the step keeps a row's states unchanged where its token is padding (``attention_mask`` 0 at
``past_length``): a left-padded prompt's padding leaves them at zero, as ``model.generate`` leaves them. No
architecture's code is read: only the Cache API the model calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, DynamicCache, LinearAttentionCacheLayerMixin

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.step import CachedStep, StepCache, StepCacheLayer, step_outputs
from pipeline.runtime.generation.layout import STATE_KINDS, CachedLayer, past_name, present_name, state_kind

#: (name kind, shape after the batch axis, dtype) of one state tensor.
StateSpec = tuple[str, tuple[int, ...], torch.dtype]


@dataclass(frozen=True)
class StateLayer:
    """One cache layer with recurrent states: its keys and values when it also attends (a hybrid layer), and its
    state tensors in order (``conv``, ``recurrent``, then further state indices)."""

    attention: CachedLayer | None
    states: tuple[StateSpec, ...]

    @property
    def key_dim(self) -> int:
        """The attention's key width (0 without attention)."""
        return self.attention.key_dim if self.attention else 0

    @property
    def value_dim(self) -> int:
        """The attention's value width (0 without attention)."""
        return self.attention.value_dim if self.attention else 0

    def kinds(self) -> tuple[str, ...]:
        """The name kinds of the layer's tensors, in step-input order."""
        return (*(("key", "value") if self.attention else ()), *(kind for kind, _, _ in self.states))

    def storage(self, rows: int, capacity: int) -> list[torch.Tensor]:
        """The layer's tensors for ``rows`` rows, zeros (keys and values of ``capacity`` positions)."""
        kv = self.attention.storage(rows, capacity) if self.attention else []
        return [*kv, *(torch.zeros(rows, *shape, dtype=dtype) for _, shape, dtype in self.states)]

    @classmethod
    def of(cls, index: int, layer: Any, owner: str) -> StateLayer:
        """The layer of a model's cache ``layer`` (a ``LinearAttentionCacheLayerMixin``) after a run."""
        states: list[StateSpec] = []
        for attribute, kind in zip(("conv_states", "recurrent_states"), STATE_KINDS, strict=True):
            for state, tensor in sorted(getattr(layer, attribute, {}).items()):
                if isinstance(tensor, torch.Tensor):
                    states.append((state_kind(kind, int(state)), tuple(int(d) for d in tensor.shape[1:]), tensor.dtype))
        states.sort(key=lambda spec: (spec[0].partition("_")[2] or "0", STATE_KINDS.index(spec[0].partition("_")[0])))
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        attention = None
        if isinstance(layer, CacheLayerMixin) and isinstance(keys, torch.Tensor) and keys.dim() == 4:
            assert isinstance(values, torch.Tensor)
            attention = CachedLayer.of(keys, values)
        if not states and attention is None and not isinstance(layer, DummyLayer):
            raise InputError(
                f"cache layer {index} of {owner} is a {type(layer).__name__} that kept no state after a run",
                fix=PLAIN_FORWARD,
            )
        return cls(attention, tuple(states))

    @property
    def empty(self) -> bool:
        """A layer without a cache (transformers' ``DummyLayer``: an MLP or MoE layer of a hybrid stack)."""
        return self.attention is None and not self.states


def holds_states(layer: Any) -> bool:
    """Whether a model's cache layer keeps recurrent states (transformers' linear-attention layers), or is the
    placeholder of a layer without a cache beside them (``DummyLayer``)."""
    return isinstance(layer, LinearAttentionCacheLayerMixin | DummyLayer)


def cached_layers(layout: Sequence[CachedLayer | StateLayer]) -> int:
    """``generation.layers``: the layers up to the last one with tensors (a trailing layer without a cache has no
    step input to count)."""
    held = [i for i, layer in enumerate(layout) if not (isinstance(layer, StateLayer) and layer.empty)]
    return held[-1] + 1 if held else 0


def cache_names(layout: Sequence[CachedLayer | StateLayer], name: Any = past_name) -> list[str]:
    """The step's cache tensor names in input order (``name``: :func:`past_name` or :func:`present_name`)."""
    return [name(i, kind) for i, layer in enumerate(layout) for kind in _kinds(layer)]


def _kinds(layer: CachedLayer | StateLayer) -> tuple[str, ...]:
    return layer.kinds()


class _States:
    """The recurrent states of one step layer: graph inputs, replaced by the model's ``update_*`` calls."""

    # as transformers' LinearAttentionCacheLayerMixin holds them (its annotations: dicts of None)
    conv_states: Any
    recurrent_states: Any
    conv_kernel_size: Any
    device: Any
    dtype: Any

    def init_states(self, tensors: dict[str, torch.Tensor]) -> None:
        """The state dicts over ``tensors`` (name kind -> graph input)."""
        self.conv_states = {}
        self.recurrent_states = {}
        for kind, tensor in tensors.items():
            base, _, index = kind.partition("_")
            # a copy: a model's one-token path writes the state it reads in place (never the graph input)
            getattr(self, f"{base}_states")[int(index or 0)] = tensor.clone()
        indices = set(self.conv_states) | set(self.recurrent_states)
        self.number_of_states = max(indices, default=0) + 1
        #: always true: a zero state is the first call's (see the module docstring)
        self.has_previous_state = dict.fromkeys(range(self.number_of_states), True)
        self.is_conv_states_initialized = {i: i in self.conv_states for i in range(self.number_of_states)}
        self.is_recurrent_states_initialized = {i: i in self.recurrent_states for i in range(self.number_of_states)}
        self.conv_kernel_size = {i: int(t.shape[-1]) for i, t in self.conv_states.items()}
        self.record_past = False

    def lazy_initialization(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to allocate: the states are the step's inputs."""

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
        """The previous inputs followed by the new ones (what the model's causal convolution runs over); the last
        ``kernel`` of them are the new state."""
        previous = self.conv_states[state_idx]
        full = torch.cat([previous.to(conv_states.dtype), conv_states], dim=-1)
        self.conv_states[state_idx] = full[..., -previous.shape[-1] :].to(previous.dtype)
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
        """The new state replaces the old."""
        dtype = self.recurrent_states[state_idx].dtype
        self.recurrent_states[state_idx] = (
            recurrent_states if recurrent_states.dtype == dtype else recurrent_states.to(dtype)
        )
        return self.recurrent_states[state_idx]

    def state_tensors(self, kinds: Sequence[str]) -> list[torch.Tensor]:
        """The states of ``kinds`` now (after the model's updates)."""
        out = []
        for kind in kinds:
            base, _, index = kind.partition("_")
            out.append(getattr(self, f"{base}_states")[int(index or 0)])
        return out

    def get_max_length(self) -> int:
        """No sequence axis."""
        return -1


class StepStateLayer(_States, LinearAttentionCacheLayerMixin):
    """A layer with recurrent states alone (linear attention, a convolution, a Mamba mixer)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.device = next(iter(tensors.values())).device
        self.dtype = next(iter(tensors.values())).dtype
        self.init_states(tensors)


class StepHybridLayer(_States, StepCacheLayer, LinearAttentionCacheLayerMixin):
    """A layer with keys and values (the static cache of :class:`StepCacheLayer`) and recurrent states."""

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        past_length: torch.Tensor,
        length: Any,
        tensors: dict[str, torch.Tensor],
    ) -> None:
        StepCacheLayer.__init__(self, keys, values, past_length, length)
        self.device, self.dtype = keys.device, keys.dtype
        self.init_states(tensors)

    def get_max_length(self) -> int:
        """The keys' capacity."""
        return StepCacheLayer.get_max_length(self)


def _attends(cache: Any) -> bool:
    """Whether one of the cache's layers caches keys and values (else every layer keeps a recurrent state)."""
    return any(isinstance(layer, CacheLayerMixin) for layer in cache.layers)


class _QueryMaskWithoutAttention:
    """A ``Cache`` mixin: when no layer attends, a mask spans the current tokens only (a model builds its attention
    mask all the same, and no layer reads it); transformers' asks an attention layer for its capacity."""

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        """The keys a mask spans: the query's own when no layer attends, else the attention layers' span."""
        if not _attends(self):
            return query_length, 0
        return super().get_mask_sizes(query_length, layer_idx)  # type: ignore[misc]


class StepStateCache(_QueryMaskWithoutAttention, StepCache):
    """The step's ``Cache`` over layers some of which hold states; its length is ``past_length`` also when no layer
    attends (transformers' asks an attention layer)."""

    def __init__(self, layers: list[Any], past_length: torch.Tensor) -> None:
        Cache.__init__(self, layers=list(layers))
        self.past_length = past_length

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        """The number of positions before this step."""
        if not _attends(self):
            return self.past_length
        return super().get_seq_length(layer_idx)


class FirstCallCache(_QueryMaskWithoutAttention, DynamicCache):
    """transformers' ``DynamicCache`` for a model's first call (the prompt from nothing, to read its cache's layout):
    its length is 0 also when no layer attends. transformers' asks an attention layer, and raises when every layer
    keeps a recurrent state (a small config whose layers are all linear attention), though nothing was cached."""

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The number of positions cached: the attention layers' count, 0 when no layer attends."""
        if not _attends(self):
            return 0
        return super().get_seq_length(layer_idx)


class RecurrentStep(CachedStep):
    """:class:`~pipeline.generation.step.CachedStep` of a model whose cache holds recurrent states (see the module
    docstring); ``*past`` is each layer's tensors in :func:`cache_names` order."""

    def __init__(self, model: torch.nn.Module, layout: Sequence[CachedLayer | StateLayer], use_interface: bool) -> None:
        super().__init__(model, len(layout), use_interface)
        self.layout = tuple(layout)
        self.onnx_input_names = {f"past_{j}": name for j, name in enumerate(cache_names(self.layout))}

    def cache_layers(self, past: Sequence[torch.Tensor], past_length: torch.Tensor, length: Any) -> list[Any]:
        """A layer per cache layer: :class:`StepCacheLayer`, :class:`StepStateLayer` or :class:`StepHybridLayer`."""
        self._past_length = past_length
        self._past: dict[str, torch.Tensor] = {}
        layers: list[Any] = []
        at = 0
        for i, spec in enumerate(self.layout):
            kinds = _kinds(spec)
            tensors = dict(zip(kinds, past[at : at + len(kinds)], strict=True))
            self._past.update({present_name(i, kind): tensor for kind, tensor in tensors.items()})
            at += len(kinds)
            if not isinstance(spec, StateLayer):
                layers.append(StepCacheLayer(tensors["key"], tensors["value"], past_length, length))
                continue
            states = {kind: tensors[kind] for kind in kinds if kind not in ("key", "value")}
            if spec.empty:
                layers.append(DummyLayer())
            elif spec.attention is None:
                layers.append(StepStateLayer(states))
            else:
                layers.append(StepHybridLayer(tensors["key"], tensors["value"], past_length, length, states))
        return layers

    def model_mask(self, attention_mask: torch.Tensor, past_length: torch.Tensor, steps: int) -> torch.Tensor:
        """The step's mask over the cache's capacity, which the model's attention layers read; a model without any
        gets the current tokens' columns (transformers' 2-D mask ends with them: Mamba multiplies its hidden states by
        it as it is). The rows whose token is not padding are noted (see :meth:`outputs`)."""
        current = _current_columns(attention_mask, past_length, steps)
        if any(isinstance(spec, CachedLayer) or spec.attention is not None for spec in self.layout):
            if steps == 1:  # transformers' recurrent mask is None for one token
                return attention_mask
            # transformers' attention masks read the first columns of a 2-D mask (the capacity), its recurrent mask
            # the last ``steps`` (the current tokens): both, side by side
            return torch.cat([attention_mask, current], dim=1)
        return current

    def run(
        self,
        tokens: dict[str, Any],
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_length: torch.Tensor,
        past: Sequence[torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """:meth:`CachedStep.run`, the rows whose token is not padding noted first for :meth:`outputs` (each call
        notes its own, whichever mask the model is handed)."""
        steps = next(iter(tokens.values())).shape[1]
        self._kept_rows = _current_columns(attention_mask, past_length, steps)[:, -1] != 0
        return super().run(tokens, attention_mask, position_ids, past_length, past)

    def cache(self, layers: list[Any]) -> Cache:
        """:class:`StepStateCache`."""
        return StepStateCache(layers, self._past_length)

    def outputs(self, logits: torch.Tensor, layers: list[Any]) -> dict[str, torch.Tensor]:
        """The logits of the last position, then every layer's tensors as ``present.{i}.{kind}``."""
        result = step_outputs(logits, [])
        kept = self._kept_rows
        for i, (spec, layer) in enumerate(zip(self.layout, layers, strict=True)):
            kinds = _kinds(spec)
            tensors: list[torch.Tensor] = []
            if "key" in kinds:
                tensors += [layer.keys, layer.values]
            if isinstance(layer, _States):
                tensors += layer.state_tensors([k for k in kinds if k not in ("key", "value")])
            for kind, tensor in zip(kinds, tensors, strict=True):
                if kind not in ("key", "value"):  # a padding token leaves the row's state as it was
                    before = self._past[present_name(i, kind)]
                    tensor = torch.where(kept.view(-1, *[1] * (tensor.dim() - 1)), tensor, before)
                result[present_name(i, kind)] = tensor
        return result


def _current_columns(attention_mask: torch.Tensor, past_length: torch.Tensor, steps: int) -> torch.Tensor:
    """The columns of ``attention_mask`` [batch, capacity] at the step's own positions (``past_length`` on)."""
    positions = (torch.arange(steps, device=attention_mask.device) + past_length).unsqueeze(0)
    return attention_mask.gather(1, positions.expand(attention_mask.shape[0], -1))
