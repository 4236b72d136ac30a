"""The cached text step of a decoder whose text reaches its images through cross-attention or keeps them in its cache
before the prompt (:mod:`pipeline.generation.cross_images`): :class:`CrossImagesStep`, its attention registered with
transformers, its sample, dimensions and profiles.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers.cache_utils import EncoderDecoderCache

from converters.generation_settings import GenerationSettings
from converters.settings import ProfileRange
from pipeline.generation.cross_layout import CrossLayout
from pipeline.generation.seq2seq import CrossCacheLayer
from pipeline.generation.step import StepCacheLayer, step_outputs
from pipeline.generation.step_attention import (
    attention_implementation,
    causal_step_mask,
    mark_cross,
    step_attention,
    step_mask,
)
from pipeline.runtime.generation.cross_images import per_token_rows, prefix_name
from pipeline.runtime.generation.layout import cross_name, past_name
from pipeline.settings import DynamicDim

#: The step's attention and mask functions' name in transformers' interfaces.
ATTENTION_NAME = "pipeline_cross_images"
#: The name of the step's masks for a model's own attention code (:func:`eager_step_mask`) in transformers' interface.
EAGER_MASK_NAME = "pipeline_cross_images_eager"


def ones_of(layout: CrossLayout, batch: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The masks of ones the model's ``generate`` hands every step whole (:attr:`CrossLayout.ones`)."""
    return {name: torch.ones(batch, *shape, dtype=dtype, device=device) for name, shape, dtype in layout.ones}


def _mixed_cache(layers: list[Any], first_self: int) -> Any:
    """A transformers ``Cache`` of ``layers`` whose cross layers stand between self-attention layers: the mask sizes
    and the seen length are the first self-attention layer's (``first_self``) when the model asks a cross layer's."""
    from transformers.cache_utils import Cache

    class MixedCache(Cache):
        def __init__(self) -> None:
            super().__init__(layers=list(layers))

        def _own(self, layer_idx: int) -> Any:
            return layers[layer_idx if isinstance(layers[layer_idx], StepCacheLayer) else first_self]

        def get_seq_length(self, layer_idx: int = 0) -> Any:
            return self._own(layer_idx).get_seq_length()

        def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> Any:
            return self._own(layer_idx).get_mask_sizes(query_length)

        def get_query_offset(self, layer_idx: int = 0) -> Any:
            return self._own(layer_idx).get_seq_length()

    return MixedCache()


def _layers_cache(layers: list[Any]) -> Any:
    """A transformers ``Cache`` of ``layers`` (one half of an encoder-decoder's pair)."""
    from transformers.cache_utils import Cache

    class LayersCache(Cache):
        def __init__(self) -> None:
            super().__init__(layers=list(layers))

    return LayersCache()


def cross_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The step's attention (:func:`~pipeline.generation.step_attention.step_attention`); a float mask (an additive
    mask the model built over the images: 0 where a token sees an image position, the dtype's lowest value elsewhere;
    one head for all) is added to the scores as a bias, under a mask that keeps every position."""
    if attention_mask is not None and attention_mask.is_floating_point():
        keep = torch.ones(attention_mask.shape, dtype=torch.bool, device=query.device)
        kwargs.pop("_past_length", None)  # the image positions are not the text's
        # one head for all: broadcast over the heads (TensorRT's decomposed attention too: generation.ops)
        return step_attention(module, query, key, value, keep, position_bias=attention_mask, **kwargs)
    return step_attention(module, query, key, value, attention_mask, **kwargs)


def register_cross_attention() -> None:
    """Register :func:`cross_attention` and the step's mask with transformers under :data:`ATTENTION_NAME`."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, cross_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, step_mask)


def eager_step_mask(*args: Any, dtype: torch.dtype = torch.float32, **kwargs: Any) -> torch.Tensor | None:
    """The step's mask (:func:`~pipeline.generation.step_attention.step_mask`: every query of a causal mask also sees
    its own position) as the additive float mask a model's own attention code adds to its scores (transformers' eager
    mask: 0 where a key is seen, the dtype's lowest value elsewhere). A padding row then attends to itself alone rather
    than averaging the whole static cache, whose rounding a float16 graph would not reproduce; no real token sees it."""
    mask = step_mask(*args, **kwargs)
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        mask = torch.where(mask, zero, torch.finfo(dtype).min)
    return mask


class CrossImagesStep(torch.nn.Module):
    """The cached text step given the cross states.

    ``forward(input_ids [B, S], attention_mask [B, capacity], position_ids [B, S], past_length [], *rest)`` with
    ``rest`` every self-attention layer's key and value caches (``past_key_values.{j}.key/value``, j counting those
    layers), every cross layer's keys and values (``cross.{k}.key/value``), the per-token masks [B, S, ...] and the
    other cross states, returns ``{"logits": ..., "present.{j}.key": ..., ...}``."""

    def __init__(self, model: torch.nn.Module, layout: CrossLayout, use_interface: bool) -> None:
        super().__init__()
        self.model = layout.text_model or model
        self.layout = layout
        self.use_interface = use_interface
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in parameters
        if use_interface:
            register_cross_attention()
        #: a causal LM a model's generate hands its images to (BLIP's) with its own attention code: its masks are the
        #: step's (:func:`eager_step_mask`), under a name of their own
        self._own_masks = not use_interface and layout.delegate is not None
        if self._own_masks:
            from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

            ALL_MASK_ATTENTION_FUNCTIONS.register(EAGER_MASK_NAME, eager_step_mask)
        self.onnx_input_names = {f"rest_{i}": name for i, name in enumerate(step_state_names(layout))}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_length: torch.Tensor,
        *rest: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """The step: logits of the last position and the updated self-attention cache."""
        layout = self.layout
        selves, crosses = len(layout.self_layers), len(layout.cross_layers)
        past, rest = rest[: 2 * selves], rest[2 * selves :]
        cross, rest = rest[: 2 * crosses], rest[2 * crosses :]
        masks, states = rest[: len(layout.per_token)], rest[len(layout.per_token) :]
        length = None
        if layout.prefix:
            # the cache's length as a number: a model that keeps its images in the cache branches on it (GIT widens
            # its mask when `cache_length > 0`); every call of the step, its prefill too, comes after the images
            length = past_length.item()
            torch._check(length >= layout.prefix)
            torch._check(length + input_ids.shape[1] <= past[0].shape[-2])
            # the step's own causal mask over the cache, the image positions in it, as an additive mask the model
            # takes as it is (a 4-d mask: it neither widens it over the images, as GIT does a 2-d one, nor builds it)
            keep = causal_step_mask(attention_mask, past_length, input_ids.shape[1])
            lowest = torch.finfo(past[0].dtype).min
            attention_mask = torch.zeros(keep.shape, dtype=past[0].dtype, device=keep.device).masked_fill(~keep, lowest)
        written = [StepCacheLayer(past[2 * j], past[2 * j + 1], past_length, length) for j in range(selves)]
        layers: list[Any] = [None] * layout.cache_size
        for (index, _), layer in zip(layout.self_layers, written, strict=True):
            layers[index] = layer
        for k, index in enumerate(layout.cross_layers):
            given = CrossCacheLayer(cross[2 * k], cross[2 * k + 1])
            mark_cross(given.keys)
            layers[index] = given
        if layout.paired:  # an encoder-decoder's pair: its cross half given and marked as computed
            cache: Any = EncoderDecoderCache(_layers_cache(layers[:selves]), _layers_cache(layers[selves:]))
            cache.is_updated = dict.fromkeys(range(crosses), True)
        else:
            cache = _mixed_cache(layers, layout.self_layers[0][0])
        call: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            self._cache_argument: cache,
            "use_cache": True,
            **dict(zip(layout.per_token, masks, strict=True)),
            # the model's rows of each state: each prompt's (IDEFICS's: one per image), prompt after prompt
            **{name: value.flatten(0, 1) for (name, _), value in zip(layout.states, states, strict=True)},
            **ones_of(layout, input_ids.shape[0], input_ids.device),
        }
        if self._logits_to_keep:
            call["logits_to_keep"] = 1
        if self.use_interface:
            call["_past_length"] = past_length
        name = ATTENTION_NAME if self.use_interface else EAGER_MASK_NAME if self._own_masks else None
        with attention_implementation(self.model, name):
            out = self.model(**call)
        return step_outputs(out.logits, written)


def step_state_names(layout: CrossLayout) -> list[str]:
    """The step's inputs after ``past_length``, in order."""
    names = [past_name(j, kind) for j in range(len(layout.self_layers)) for kind in ("key", "value")]
    names += [cross_name(k, kind) for k in range(len(layout.cross_layers)) for kind in ("key", "value")]
    return [*names, *layout.per_token, *(name for name, _ in layout.states)]


# the conversion


def step_sample(
    inputs: dict[str, torch.Tensor], cross: dict[str, torch.Tensor], layout: CrossLayout, generation: GenerationSettings
) -> tuple[Any, tuple[DynamicDim, ...]]:
    """The step's sample (the sample's prompts prefilled with their cross states) and its dynamic dimensions."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    rows, steps = ids.shape
    capacity, prefix = generation.max_length, layout.prefix
    full = torch.zeros(rows, capacity, dtype=torch.int64)
    full[:, :prefix] = 1  # the image positions a cache holds before the prompt (GIT's), written below
    full[:, prefix : prefix + steps] = mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    past = [t for _, layer in layout.self_layers for t in layer.storage(rows, capacity)]
    if prefix:
        firsts = [cross[prefix_name(j, kind)] for j in range(len(layout.self_layers)) for kind in ("key", "value")]
        for tensor, first in zip(past, firsts, strict=True):
            tensor[:, :, :prefix] = first.to(tensor.dtype)
    masks = [per_token_rows(inputs[name], steps) for name in layout.per_token]
    crosses = [cross[cross_name(k, kind)] for k in range(len(layout.cross_layers)) for kind in ("key", "value")]
    others = [cross[name] for name, _ in layout.states]
    length = torch.tensor(prefix, dtype=torch.int64)
    sample: Any = ((ids, full, positions, length, *past, *crosses, *masks, *others), {})
    names = ["input_ids", "attention_mask", "position_ids", *step_state_names(layout)]
    dims: list[DynamicDim] = []
    if generation.max_batch >= 2:
        dims += [DynamicDim(name, 0, "batch", 1, rows, generation.max_batch) for name in names]
    longest = generation.max_prompt or capacity
    for name in ("input_ids", "position_ids", *layout.per_token):
        dims.append(DynamicDim(name, 1, "sequence", 1, steps, longest))
    return sample, tuple(dims)


def step_profiles(generation: GenerationSettings) -> tuple[tuple[ProfileRange, ...], ...]:
    """Context (the prompt) and generation (one token)."""
    longest = generation.max_prompt or generation.max_length
    return ((ProfileRange("sequence", 1, min(longest, 64), longest),), (ProfileRange("sequence", 1, 1, 1),))
