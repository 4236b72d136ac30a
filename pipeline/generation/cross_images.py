"""``convert(model, {"input_ids": ..., "pixel_values": ..., ...}, generation={...})`` for a decoder whose text reaches
its images through cross-attention (Mllama, IDEFICS, BLIP's captioning head) or keeps them in its cache before the
prompt (GIT): an image graph run once per request and a cached text step.

This is the encoder-decoder shape (:mod:`pipeline.generation.encoder_decoder`) with the images as the source and the
text model as a decoder-only step over a prompt. Where the images go is read from the model's own ``generate``
(:mod:`pipeline.generation.cross_layout`): the image inputs, the cache layers that hold image states, the other image
states its decode steps are handed, and the per-token image masks (``generate`` pads a prompt's rows up to its length
with the last row, and each new token's row is the last row again; the runtime does the same).

:class:`CrossImages` is the image graph: the model run on the images and one text token, returning the cross states
(``cross.{i}.key/value``, i counting the layers holding image states, and the other states by their forward argument's
name). :class:`CrossImagesStep` is the text step: :class:`~pipeline.generation.step.CachedStep`'s static
self-attention cache (the layers that grew), the cross layers given (:class:`~pipeline.generation.seq2seq.
CrossCacheLayer`), the per-token masks and the other cross states as inputs. Its attention is the step's; an additive
float mask (both models turn their image masks into one) is given to it as a bias. The result is a
:class:`~pipeline.runtime.generation.cross_images.CrossImagesModule`, saved as an encoder-decoder directory. When
validating, each graph is validated against PyTorch on its own sample, then the sample's greedy decoding is compared
token for token with the model's own ``generate`` and every step's logits judged.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import EncoderDecoderCache

from converters.errors import AccuracyError, InputError
from converters.generation_settings import GenerationSettings, check_token_ids, token_ids
from converters.registry import ConverterRegistry
from converters.settings import ProfileRange
from pipeline.generation.conversion import (
    attention_form,
    check_attention_layers,
    check_sample_fits,
    special_tokens,
    step_precision_io,
)
from pipeline.generation.cross_layout import CrossLayout, cache_layers, cross_layout, state_at
from pipeline.generation.generate_scores import (
    GROSS,
    diverged,
    follow_tokens,
    greedy_options,
    judged_logits,
    prompt_tokens,
    with_decoding,
)
from pipeline.generation.handed_prompt import handed_prompt
from pipeline.generation.ops import GENERATION_OPSET, generation_converters
from pipeline.generation.seq2seq import CrossCacheLayer, cache_of
from pipeline.generation.step import (
    StepCacheLayer,
    attention_implementation,
    causal_step_mask,
    mark_cross,
    step_attention,
    step_mask,
    step_outputs,
    uses_attention_interface,
)
from pipeline.runtime.generation.cross_images import (
    PROMPT_EDIT,
    CrossImagesModule,
    edited_prompt,
    per_token_rows,
    prefix_name,
)
from pipeline.runtime.generation.layout import cross_name, past_name
from pipeline.runtime.io_spec import normalise_sample
from pipeline.runtime.module import ConvertedModule
from pipeline.settings import DynamicDim, Settings

logger = logging.getLogger(__name__)

#: Convert one part (module, sample, settings, converters) through the stages.
Stages = Callable[[torch.nn.Module, Any, Settings, ConverterRegistry], ConvertedModule]

#: The step's attention and mask functions' name in transformers' interfaces.
ATTENTION_NAME = "pipeline_cross_images"
#: The name of the step's masks for a model's own attention code (:func:`eager_step_mask`) in transformers' interface.
EAGER_MASK_NAME = "pipeline_cross_images_eager"
#: Tokens of the greedy decoding compared with the model's own ``generate`` when validating.
VALIDATION_TOKENS = 8
# the two graphs


class CrossImages(torch.nn.Module):
    """``forward(*image_inputs)``: the cross states of the images, ``{"cross.{i}.key": ..., ..., state: ...}``,
    computed by the model itself on the images and one text token (``token``), each per-token mask one row of ones
    (``rows``: its shape after the token axis). A state other than the cross layers' comes out with a row per prompt:
    [prompts, its rows of each prompt, ...]."""

    def __init__(
        self, model: torch.nn.Module, layout: CrossLayout, token: int, rows: dict[str, tuple[torch.Size, torch.dtype]]
    ) -> None:
        super().__init__()
        self.model = model
        self.layout = layout
        self.token = token
        self.rows = rows
        self.onnx_input_names = {f"inputs_{i}": name for i, name in enumerate(layout.image_inputs)}
        if len(layout.image_inputs) == 1:
            self.onnx_input_names["inputs"] = layout.image_inputs[0]

    def forward(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The cross states for the image inputs ``inputs`` (in the layout's order)."""
        batch = inputs[0].shape[0]
        device = inputs[0].device
        call: dict[str, Any] = dict(zip(self.layout.image_inputs, inputs, strict=True))
        call["input_ids"] = torch.full((batch, 1), self.token, dtype=torch.int64, device=device)
        call["attention_mask"] = torch.ones(batch, 1, dtype=torch.int64, device=device)
        for name, (shape, dtype) in self.rows.items():
            call[name] = torch.ones(batch, 1, *shape, dtype=dtype, device=device)
        text = self.layout.text_model
        if text is None:
            out = self.model(**call, use_cache=True)
            states = {name: state_at(out, path) for name, path in self.layout.states}
        else:  # the model's forward gives the states its generate hands its text decoder's, which caches them
            out = self.model(**call)
            states = {name: state_at(out, path) for name, path in self.layout.states}
            handed = {"input_ids": call["input_ids"], "attention_mask": call["attention_mask"], **states}
            handed.update(ones_of(self.layout, batch, device))
            out = text(**handed, use_cache=True)
        result: dict[str, torch.Tensor] = {}
        layers = cache_layers(cache_of(out))[0]
        prefix = self.layout.prefix
        for j, (index, _) in enumerate(self.layout.self_layers if prefix else ()):
            # the image positions at the cache's start: they do not see the text after them (checked)
            result[prefix_name(j, "key")] = layers[index].keys[:, :, :prefix]
            result[prefix_name(j, "value")] = layers[index].values[:, :, :prefix]
        for k, index in enumerate(self.layout.cross_layers):
            result[cross_name(k, "key")] = layers[index].keys
            result[cross_name(k, "value")] = layers[index].values
        for name, state in states.items():
            # [prompts x per prompt (IDEFICS's: one per image), ...]: a row per prompt
            result[name] = state.reshape(batch, -1, *state.shape[1:])
        return result


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
    """The step's attention (:func:`~pipeline.generation.step.step_attention`); a float mask (an additive mask the
    model built over the images: 0 where a token sees an image position, the dtype's lowest value elsewhere; one head
    for all) is added to the scores as a bias, under a mask that keeps every position."""
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
    """The step's mask (:func:`~pipeline.generation.step.step_mask`: every query of a causal mask also sees its own
    position) as the additive float mask a model's own attention code adds to its scores (transformers' eager mask:
    0 where a key is seen, the dtype's lowest value elsewhere). A padding row then attends to itself alone rather than
    averaging the whole static cache, whose rounding a float16 graph would not reproduce; no real token sees it."""
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


def convert_cross_images(
    model: torch.nn.Module, sample: Any, settings: Settings, registry: ConverterRegistry, stages: Stages
) -> CrossImagesModule:
    """The image graph and the cached text step of ``model``, converted (see the module docstring)."""
    generation = settings.generation
    assert generation is not None
    given = _sample_inputs(model, sample)
    check_attention_layers(model)
    layout = cross_layout(model, given)
    inputs, options = _handed_inputs(model, given, layout)
    ids = inputs["input_ids"]
    # the image positions a cache holds before the prompt (GIT's) take their room in it
    check_sample_fits(ids.new_zeros(ids.shape[0], ids.shape[1] + layout.prefix), generation, settings.validate)
    selves = [layer for _, layer in layout.self_layers]
    eos, pad = _special_tokens(model, layout, generation)
    from_model = tuple(n for n in ("eos_token_id", "pad_token_id") if getattr(generation, n) in ((), None))
    generation = dataclasses.replace(
        generation,
        layers=len(selves),
        eos_token_id=eos,
        pad_token_id=pad,
        attention=attention_form(model, settings, selves),
        model_options=(*generation.model_options, *options),
        max_prompt=min(generation.max_prompt or generation.max_length, generation.max_length - layout.prefix),
    )
    generation = check_token_ids(generation, layout.vocabulary, from_model)
    if ids.shape[0] == 1 and generation.max_batch >= 2:  # the export specialises a batch of 1: the row twice
        inputs = {name: torch.cat([value, value]) for name, value in inputs.items()}
    images = {name: inputs[name] for name in layout.image_inputs}
    rows = {name: (inputs[name].shape[2:], inputs[name].dtype) for name in layout.per_token}
    encoder = CrossImages(model, layout, int(ids[0, -1]), rows).train(model.training)
    with torch.no_grad():
        cross = encoder(*images.values())
    if layout.prefix:
        _check_prefix_alone(model, layout, images, rows, cross, int(ids[0, -1]))
    precision_io = step_precision_io(settings)
    batch = [DynamicDim(n, 0, "batch", 1, 2, generation.max_batch) for n in images] if generation.max_batch >= 2 else []
    encoder_settings = dataclasses.replace(
        settings, generation=None, dynamic=tuple(batch), profiles=(), precision_io=precision_io
    )
    logger.info("cross-attended images: converting the image graph (%s -> cross states)", ", ".join(images))
    encoder_module = stages(encoder, tuple(images.values()), encoder_settings, registry)
    text_model = _text_model(layout.text_model or model)
    step = CrossImagesStep(model, layout, uses_attention_interface(text_model)).train(model.training)
    step_sample, dims = _step_sample(inputs, cross, layout, generation)
    step_settings = dataclasses.replace(
        settings,
        generation=generation,
        dynamic=dims,
        opset=max(settings.opset or GENERATION_OPSET, GENERATION_OPSET),
        profiles=_profiles(generation),
        precision_io=precision_io,
        validation_inputs=0,  # drawn ids would not match the images: the sample's prompts are what it validates on
    )
    logger.info("cross-attended images: converting the text step (cache of %d tokens)", generation.max_length)
    step_module = stages(step, step_sample, step_settings, generation_converters(registry))
    module = CrossImagesModule(encoder_module, step_module)
    if settings.validate:
        _validate_greedy(model, module, given, step_settings)
    return module


def _check_prefix_alone(
    model: torch.nn.Module,
    layout: CrossLayout,
    images: dict[str, torch.Tensor],
    rows: dict[str, tuple[torch.Size, torch.dtype]],
    cross: dict[str, torch.Tensor],
    token: int,
) -> None:
    """The image positions a cache holds before the prompt are the image graph's (computed with one text token) only
    when they do not attend to the text after them: an InputError when another token changes them."""
    other = CrossImages(model, layout, (token + 1) % max(layout.vocabulary, 2), rows).train(model.training)
    with torch.no_grad():
        again = other(*images.values())
    moved = [name for name, value in cross.items() if not torch.allclose(value, again[name], rtol=1e-4, atol=1e-5)]
    if moved:
        raise InputError(
            f"{type(model).__name__} caches {layout.prefix} image positions before its prompt, but they attend to the "
            f"text after them ({moved[0]} changes with the text): the image graph cannot compute them alone",
            fix="convert without generation= (the plain forward)",
        )


def _copies(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in inputs.items()}


def _handed_inputs(
    model: torch.nn.Module, given: dict[str, torch.Tensor], layout: CrossLayout
) -> tuple[dict[str, torch.Tensor], tuple[tuple[str, Any], ...]]:
    """The sample as the model's ``generate`` hands its text decoder's the prompt (:mod:`pipeline.generation.
    handed_prompt`: BLIP's, its first token its bos and its last dropped), and the step's ``model_options`` saying
    so (:data:`~pipeline.runtime.generation.cross_images.PROMPT_EDIT`); the sample as it is for a model whose own
    forward is the step."""
    if layout.delegate is None:
        return given, ()
    first = {name: value[:1] for name, value in given.items()}
    edit = handed_prompt(model, first, layout.delegate, layout.vocabulary)
    if edit == (0, ()):
        return given, ()
    ids, mask = edited_prompt(given["input_ids"], given["attention_mask"], edit)
    logger.info("cross-attended images: the prompt as %s.generate hands it (%s)", type(model).__name__, edit)
    return {**given, "input_ids": ids, "attention_mask": mask}, ((PROMPT_EDIT, edit),)


def _special_tokens(
    model: torch.nn.Module, layout: CrossLayout, generation: GenerationSettings
) -> tuple[tuple[int, ...], int | None]:
    """eos and pad ids: as given, else as the model's ``generate`` hands its text decoder's (BLIP's: its text
    config's separator and padding), else from the generation config of the model the step calls."""
    eos, pad = generation.eos_token_id, generation.pad_token_id
    handed = {} if layout.delegate is None else layout.delegate.handed
    if not eos and handed.get("eos_token_id") is not None:
        eos = token_ids("eos_token_id", handed["eos_token_id"])
    if pad is None and handed.get("pad_token_id") is not None:
        pad = token_ids("pad_token_id", handed["pad_token_id"], single=True)[0]
    return special_tokens(layout.text_model or model, eos, pad)


def _text_model(model: torch.nn.Module) -> torch.nn.Module:
    """The text decoder (whose attention is the step's: a vision tower's own attention code does not decide it)."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    return decoder if isinstance(decoder, torch.nn.Module) else model


def _sample_inputs(model: torch.nn.Module, sample: Any) -> dict[str, torch.Tensor]:
    """The sample as named tensors with an int64 ``input_ids`` [batch, tokens] and its ``attention_mask``."""
    args, kwargs = normalise_sample(sample)
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        kwargs, args = dict(args[0]), ()
    ids = kwargs.get("input_ids")
    if args or not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise InputError(
            f"the generation sample of {type(model).__name__} (its text cross-attends to its images) is a dict of its "
            "processor's tensors with input_ids [batch, tokens] and pixel_values",
            fix='pass pipeline.convert(model, {"input_ids": ..., "attention_mask": ..., "pixel_values": ..., ...}, '
            "generation={...})",
        )
    not_tensors = sorted(name for name, value in kwargs.items() if not isinstance(value, torch.Tensor))
    if not_tensors:
        raise InputError(
            f"the generation sample's {', '.join(not_tensors)} are not tensors",
            fix="pass tensors only (the processor's return_tensors='pt' output)",
        )
    rows = {value.shape[0] for value in kwargs.values()}
    if len(rows) != 1:
        raise InputError(
            f"the generation sample's inputs have different batch sizes {sorted(rows)}",
            fix="pass one row per prompt in every input (the processor's output)",
        )
    given = dict(kwargs)
    given["input_ids"] = ids.to(torch.int64)
    given["attention_mask"] = given.get("attention_mask", torch.ones_like(ids)).to(torch.int64)
    return given


def _step_sample(
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


def _profiles(generation: GenerationSettings) -> tuple[tuple[ProfileRange, ...], ...]:
    """Context (the prompt) and generation (one token)."""
    longest = generation.max_prompt or generation.max_length
    return ((ProfileRange("sequence", 1, min(longest, 64), longest),), (ProfileRange("sequence", 1, 1, 1),))


def _validate_greedy(
    model: torch.nn.Module, module: CrossImagesModule, inputs: dict[str, torch.Tensor], settings: Settings
) -> None:
    """The sample's greedy decoding, token for token against ``model.generate``, then every step's logits
    (:mod:`pipeline.generation.generate_scores`): the step's report holds them as its ``decoding``."""
    options = greedy_options(VALIDATION_TOKENS)
    with torch.no_grad():  # copies: a model's generate may write into its inputs (BLIP's, its bos)
        expected = model.generate(**_copies(inputs), **options)  # type: ignore[operator]
    actual: Any = module.generate(**inputs, **options)
    wanted = torch.as_tensor(getattr(expected, "sequences", expected))
    chosen = actual.sequences
    departed = not torch.equal(wanted, chosen)
    if departed and (settings.precision == "fp32" or wanted.shape[1] > chosen.shape[1]):
        raise AccuracyError(
            f"the converted model's greedy tokens differ from {type(model).__name__}.generate on the sample: expected "
            f"{wanted.tolist()}, got {chosen.tolist()}",
            fix="convert with precision='fp32' to confirm; report the model (each graph passed its validation)",
        )
    if departed:  # a lower precision's near tie: the steps are judged on PyTorch's tokens, the departure reported
        actual = module.generate(**inputs, **options, logits_processor=follow_tokens(wanted))
    edit = dict(module.generation.model_options).get(PROMPT_EDIT)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    if edit is not None:  # the sequences start with the prompt as the model's generate hands it
        ids, mask = edited_prompt(ids, mask, edit)
    label = f"sample {ids.shape[0]}x{ids.shape[1]} with its images"
    tokens = prompt_tokens(mask, ids)
    generate: Any = getattr(model, "generate")  # noqa: B009 - nn.Module types it as a tensor

    def again(**more: Any) -> Any:
        return generate(**_copies(inputs), **options, **more)

    judged = judged_logits(actual, expected, module.decoder.io, settings, label, tokens, again, model)
    worst = None if judged is None else judged.worst_step
    if departed and (worst is None or worst.max_abs > GROSS * worst.atol_used):
        raise AccuracyError(
            f"the converted model's greedy tokens differ from {type(model).__name__}.generate on the sample "
            f"({settings.precision}), and its logits fed PyTorch's tokens are more than {GROSS:g}x beyond the accuracy "
            "policy" + ("" if worst is None else f" (step {worst.step}: {worst.max_abs:.3g})"),
            fix="convert with precision='fp32' to confirm, or keep the offending layers in float32 (keep_fp32=[...])",
        )
    with_decoding(module.decoder, diverged(judged, wanted, chosen, ids.shape[1]) if departed else judged)
