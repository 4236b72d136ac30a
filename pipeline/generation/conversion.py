"""``convert(model, input_ids, generation={...})``: what the stages convert instead of the model's forward.

:func:`prepare_step` checks the model (a transformers causal LM with a key/value cache), finds its cache layout by
running it once on two tokens (the number of cached layers: no architecture's code is read), and returns the
:class:`~pipeline.generation.step.CachedStep`, its sample, the settings it exports with (opset 24, the batch and
sequence dimensions dynamic) and the converters of the step's two ops. The stages then run unchanged.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from converters.errors import InputError
from converters.generation_settings import GenerationSettings, check_token_ids, token_ids
from converters.registry import ConverterRegistry
from converters.settings import PrecisionIO, ProfileRange
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.decoder_static_check import checked_step
from pipeline.generation.kept_windows import kept_window_of
from pipeline.generation.model_cache import model_cache_layout
from pipeline.generation.ops import GENERATION_OPSET, generation_converters, on_tensorrt
from pipeline.generation.prompt_graph import probed_generation
from pipeline.generation.recurrent_state import (
    RecurrentStep,
    StateLayer,
    cache_names,
    cached_layers,
)
from pipeline.generation.step import CachedStep
from pipeline.generation.step_attention import uses_attention_interface
from pipeline.runtime.generation.options import NOT_TAKEN_DECODING, model_defaults
from pipeline.runtime.io_spec import normalise_sample
from pipeline.settings import DynamicDim, Settings

logger = logging.getLogger(__name__)

#: Step inputs with a batch axis (axis 0) and a sequence axis (axis 1).
_SEQUENCE_INPUTS = ("input_ids", "position_ids")


def prepare_step(
    model: torch.nn.Module, sample: Any, settings: Settings, registry: ConverterRegistry
) -> tuple[CachedStep, Any, Settings, ConverterRegistry]:
    """The cached step of ``model`` with its sample, settings and converters (see the module docstring)."""
    generation = settings.generation
    assert generation is not None
    input_ids = _prompt_ids(model, sample)
    check_sample_fits(input_ids, generation, settings.validate)
    check_attention_layers(model, states=True)
    layout, vocabulary = model_cache_layout(model, input_ids)
    generation = dataclasses.replace(generation, kept_window=kept_window_of(model, layout))
    states = any(isinstance(layer, StateLayer) for layer in layout)
    if states:
        generation = one_token_prompt(model, generation)
    eos, pad = special_tokens(model, generation.eos_token_id, generation.pad_token_id)
    attention = attention_form(model, settings, layout)
    from_model = tuple(n for n in ("eos_token_id", "pad_token_id") if getattr(generation, n) in ((), None))
    generation = dataclasses.replace(
        generation,
        layers=cached_layers(layout) if states else len(layout),
        eos_token_id=eos,
        pad_token_id=pad,
        attention=attention,
        model_options=model_options(model, generation.max_length),
    )
    generation = check_token_ids(generation, vocabulary, from_model)
    use_interface = uses_attention_interface(
        model,
        "the cache is written with TensorScatter, but its own attention code is exported as it is (no ONNX "
        "Attention node)",
    )
    if states:
        step: CachedStep = RecurrentStep(model, layout, use_interface)
        generation = probed_generation(model, step, layout, input_ids, generation, settings.generation)
    else:
        step = checked_step(model, layout, use_interface, input_ids, generation)
    step = step.train(model.training)  # no "training mode" warning
    if (
        not states
        and generation.max_length >= 2
        and (generation.max_prompt or generation.max_length) >= generation.max_length
    ):
        # a prompt leaves one position of the cache at least, as a vision-language step's (vision_language.py): code
        # that cuts the prompt's columns off the cache-wide mask (transformers' create_recurrent_attention_mask, which
        # LFM2 calls even with attention layers alone: `attention_mask[:, -tokens:].contiguous()`, a slice contiguous
        # only when the prompt fills the cache) branches on "the prompt fills the cache": torch.export holds that
        # branch over the range and refuses it ("Constraints violated (sequence)")
        if generation.max_prompt:
            logger.info(
                "generation: max_prompt %d taken as %d (a prompt leaves one cache position; longer ones run in pieces)",
                generation.max_prompt,
                generation.max_length - 1,
            )
        generation = dataclasses.replace(generation, max_prompt=generation.max_length - 1)
    batch = 2 if generation.max_batch >= 2 else 1
    steps = 2 if generation.max_prompt and generation.max_prompt >= 2 else 1
    capacity = generation.max_length
    ids = input_ids[:1, :steps].expand(batch, -1).clone() if input_ids.shape[1] >= steps else input_ids
    mask = torch.zeros(batch, capacity, dtype=torch.int64)
    mask[:, :steps] = 1
    positions = torch.arange(steps).unsqueeze(0).expand(batch, -1).clone()
    past = [tensor for layer in layout for tensor in layer.storage(batch, capacity)]
    step_sample: Any = ((ids, mask, positions, torch.tensor(0, dtype=torch.int64), *past), {})
    dims = _dynamic_dims(cache_names(layout), batch, steps, generation.max_batch, generation.max_prompt or capacity)
    opset = max(settings.opset or GENERATION_OPSET, GENERATION_OPSET)
    config = dataclasses.replace(
        settings,
        generation=generation,
        dynamic=dims,
        opset=opset,
        profiles=_profiles(dims, generation.max_prompt or capacity),
        precision_io=step_precision_io(settings),
    )
    return step, step_sample, config, generation_converters(registry)


#: A recurrent model's prompt graph's tokens per run when ``max_prompt`` is not given (at most half the capacity: a
#: prompt's first run is left-padded to it, and the padding holds cache positions).
PROMPT_TOKENS = 64


def one_token_prompt(
    model: torch.nn.Module, generation: GenerationSettings, prompt_graph: bool = True
) -> GenerationSettings:
    """``generation`` with ``max_prompt=1`` (the one-token step of a model whose cache keeps recurrent states:
    :mod:`pipeline.generation.recurrent_state`) and ``prompt_tokens``, the tokens per run of its prompt graph
    (:mod:`pipeline.generation.prompt_graph`): the ``max_prompt`` asked for, else :data:`PROMPT_TOKENS` (at most half
    of ``max_length``); ``max_prompt=1`` asks for no prompt graph (a prompt is fed token by token). Without
    ``prompt_graph`` (a kind of model that has none yet), a ``max_prompt`` asked for is overridden with a warning."""
    asked = generation.max_prompt
    default = asked in (None, generation.max_length)  # not given (a prompt may fill the cache)
    tokens = min(PROMPT_TOKENS, generation.max_length // 2) if default else min(asked or 1, generation.max_length - 1)
    tokens = tokens if prompt_graph and tokens >= 2 else 0
    said = f"{type(model).__name__} keeps recurrent states: its step takes one token (max_prompt=1)"
    if tokens:
        logger.info("%s; its prompt graph takes %d tokens per run", said, tokens)
    elif generation.names_prompt_length or (default and prompt_graph):  # said, not dropped
        why = (
            f"max_length={generation.max_length} leaves no room for a prompt graph of 2 tokens or more"
            if prompt_graph
            else f"not the max_prompt={asked} asked for: this kind of model has no prompt graph yet"
        )
        warnings.warn(f"{said}, {why}: a prompt of n tokens is prefilled in n steps", stacklevel=3)
    elif default and not prompt_graph:
        logger.info(said)
    return dataclasses.replace(generation, max_prompt=1, prompt_tokens=tokens)


def _profiles(dims: tuple[DynamicDim, ...], max_prompt: int) -> tuple[tuple[ProfileRange, ...], ...]:
    """Two optimization profiles of one engine, as TensorRT Edge-LLM builds them: context (the prompt, sequence up
    to ``max_prompt``) and generation (sequence 1). Without a dynamic sequence: the one profile of ``dims``."""
    if not any(d.name == "sequence" for d in dims):
        return ()
    return ((ProfileRange("sequence", 1, min(max_prompt, 64), max_prompt),), (ProfileRange("sequence", 1, 1, 1),))


def step_precision_io(settings: Settings) -> PrecisionIO:
    """fp16 steps take and return the cache in float16: TensorRT's KV-cache update needs the cache to be a network
    input of the type it computes in (a cast between them is refused), and a float32 cache would be converted
    twice per step."""
    if settings.precision == "fp16" and settings.precision_io == "model":
        logger.info("generation in fp16: the cache inputs and outputs (and logits) are float16 (precision_io='low')")
        return "low"
    return settings.precision_io


#: Sample inputs of images or audio (besides any name holding "pixel" or "image") that a causal LM's step cannot take.
MEDIA_INPUTS = frozenset({"input_features", "input_values", "audio_values", "audio_features"})


def _why_no_features(model: torch.nn.Module, media: list[str]) -> str:
    """Why a model whose forward takes the sample's ``media`` is not a vision- or audio-language decoder: the method
    giving the features (the features graph) is what it lacks (Qwen2-Audio computes its audio features inside its
    forward), or nothing to say."""
    try:
        taken = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return ""
    from pipeline.generation.audio_features import why_not_found

    wanted = {"pixel_values": "get_image_features", "input_features": "get_audio_features"}
    unfound = why_not_found(model)
    lacking = [
        f"its forward takes {name}, but it has no {method} (the features graph): it computes them inside its forward"
        + (f", where they were not found: {unfound}" if unfound and name == "input_features" else "")
        for name, method in wanted.items()
        if name in media
        and name in taken
        and not any(callable(getattr(owner, method, None)) for owner in (model, getattr(model, "model", None)))
    ]
    return f" ({'; '.join(lacking)})" if lacking else ""


def _prompt_ids(model: torch.nn.Module, sample: Any) -> torch.Tensor:
    if not (hasattr(model, "config") and hasattr(model, "generate")):
        raise InputError(
            f"generation= converts a transformers causal LM (a model with .config and .generate); got "
            f"{type(model).__name__}",
            fix="pass a transformers *ForCausalLM model, or convert without generation=",
        )
    args, kwargs = normalise_sample(sample)
    media = [name for name in kwargs if name in MEDIA_INPUTS or "pixel" in name or "image" in name]
    if media:  # the causal LM's step takes token ids only: the images or audio would be dropped without a word
        raise InputError(
            f"the generation sample holds {', '.join(media)}, which {type(model).__name__} is not converted with"
            + _why_no_features(model, media)
            + ": generation= places images for models with get_image_features whose forward takes pixel_values "
            "(vision-language decoders), audio for models with get_audio_features whose forward takes "
            "input_features (audio-language decoders) and for encoder-decoders; this one is none of them",
            fix="convert its text decoder with a sample of input_ids (and attention_mask) alone, or convert "
            "without generation= for the plain forward",
        )
    ids = kwargs.get("input_ids", args[0] if args else None)
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 2:
        raise InputError(
            "generation= needs a sample of input_ids: an int64 tensor [batch, tokens]",
            fix="pass pipeline.convert(model, input_ids, generation={...})",
        )
    return ids


def check_sample_fits(input_ids: torch.Tensor, generation: GenerationSettings, validate: bool) -> None:
    """The sample's prompts fit the step: at most ``max_batch`` rows, and their tokens plus the tokens decoded after
    them (``validation_steps`` when validating, else the one new token any prompt needs) within ``max_length``.
    Never cut to fit: validation would judge another prompt than the one given."""
    rows, tokens = input_ids.shape
    if rows > generation.max_batch:
        raise InputError(
            f"the generation sample does not fit: it has {rows} rows (prompts), but generation max_batch="
            f"{generation.max_batch} is the largest batch the step takes",
            fix=f"pass generation={{'max_batch': {rows}, ...}} or more, or a sample of at most "
            f"{generation.max_batch} rows",
        )
    after = max(generation.validation_steps, 1) if validate else 1
    needed = tokens + after
    if needed > generation.max_length:
        what = f"the {after} decode step(s) validation judges (validation_steps)" if validate else "one new token"
        options = [f"pass generation={{'max_length': {needed}, ...}} or more"]
        if generation.max_length - after >= 1:
            options.append(f"a sample of at most {generation.max_length - after} tokens")
        if validate and tokens < generation.max_length:
            options.append(f"validation_steps={generation.max_length - tokens}")
        elif generation.max_length - after < 1:
            options.append(f"a sample shorter than {generation.max_length} tokens with validation_steps lowered to fit")
        raise InputError(
            f"the generation sample does not fit: its {tokens} tokens plus {what} need max_length >= {needed}, but "
            f"generation max_length={generation.max_length} (the cache capacity)",
            fix=", or ".join(options),
        )


#: Words in a config's ``layer_types`` of layers that keep a recurrent state (linear attention, short convolutions,
#: state-space and hybrid layers).
RECURRENT_LAYER_WORDS = ("linear", "conv", "mamba", "hybrid", "recurrent", "ssm", "rwkv")
#: Words of layers whose cache is not attention's keys and values alone: a recurrent state, or an indexer's key cache
#: beside the keys and values (DeepSeek sparse attention's "indexed_attention", which only the decoder-only steps
#: cache: :class:`~pipeline.generation.step.StepIndexedLayer`).
UNCACHED_LAYER_WORDS = (*RECURRENT_LAYER_WORDS, "indexed")
#: Of those, the words of layers a causal LM's step cannot cache even with recurrent states
#: (:mod:`pipeline.generation.recurrent_state`): RWKV's (not on transformers' Cache API).
UNCACHED_STATE_WORDS = ("rwkv",)


def names_recurrent_layers(model: torch.nn.Module) -> bool:
    """Whether the model's config (or its ``text_config``) lists layers that keep a recurrent state
    (:data:`UNCACHED_LAYER_WORDS` in its ``layer_types``)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    types = getattr(config, "layer_types", None)
    return isinstance(types, list | tuple) and any(w in str(t) for t in types for w in RECURRENT_LAYER_WORDS)


def check_attention_layers(model: torch.nn.Module, states: bool = False) -> None:
    """An InputError, before any run, for a model whose config lists layers the step cannot cache (``states``: a
    causal LM's step, which caches recurrent states too)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    types = getattr(config, "layer_types", None)
    if not isinstance(types, list | tuple):
        return
    words = UNCACHED_STATE_WORDS if states else UNCACHED_LAYER_WORDS
    refused = sorted({str(t) for t in types if any(word in str(t) for word in words)})
    if refused:
        count = sum(1 for t in types if str(t) in refused)
        what = (
            "generation= caches attention's keys and values (and an indexer's), and linear-attention, convolution "
            "and state-space layers' recurrent states, not RWKV's"
            if states
            else "this generation= step caches the keys and values of attention layers only (a linear-attention, "
            "convolution or state-space layer keeps a recurrent state, an indexed layer an indexer's key cache "
            "besides: only a decoder-only step caches those)"
        )
        raise InputError(
            f"{type(model).__name__} has {count} of its {len(types)} layers of kind {', '.join(refused)}: {what}",
            fix=PLAIN_FORWARD,
        )


def attention_form(model: torch.nn.Module, settings: Settings, layers: Sequence[Any] = ()) -> str:
    """``generation.attention`` made concrete: "auto" is decomposed where TensorRT would refuse ONNX ``Attention``
    (fp32: no dedicated kernel, and not decomposable from ONNX; a softcap: not supported; keys wider than values, as
    multi-head latent attention's are: its attention layer needs keys and values of one shape), else "onnx"."""
    assert settings.generation is not None
    chosen = settings.generation.attention
    if chosen != "auto":
        return chosen
    softcap = _config_has(getattr(model, "config", None), "attn_logit_softcapping")
    trt = on_tensorrt(settings)
    uneven = any(layer.key_dim != layer.value_dim for layer in layers)
    return "decomposed" if trt and (settings.precision in ("fp32", "int8", "fp8") or softcap or uneven) else "onnx"


def _config_has(config: Any, name: str) -> bool:
    """Does ``config`` or a config nested in it (an encoder-decoder's ``decoder``, a vision-language model's
    ``text_config``) set ``name`` to a true value (T5Gemma's softcap is in its decoder's config)?"""
    seen: set[int] = set()

    def visit(node: Any) -> bool:
        if id(node) in seen or not hasattr(node, "to_dict"):
            return False
        seen.add(id(node))
        return bool(getattr(node, name, None)) or any(visit(value) for value in vars(node).values())

    return visit(config)


def special_tokens(model: torch.nn.Module, eos: tuple[int, ...], pad: int | None) -> tuple[tuple[int, ...], int | None]:
    """eos and pad ids: as given, else from the model's generation config (pad: eos[0] when the model has none,
    as transformers does)."""
    config = getattr(model, "generation_config", None)
    if not eos:
        found = getattr(config, "eos_token_id", None)
        eos = () if found is None else _configured("eos_token_id", found)
    if pad is None:
        found = getattr(config, "pad_token_id", None)
        pad = _configured("pad_token_id", found)[0] if found is not None else (eos[0] if eos else None)
    return eos, pad


def model_options(model: torch.nn.Module, capacity: int) -> tuple[tuple[str, Any], ...]:
    """The defaults the model's generation config gives ``generate`` (forced and suppressed tokens, sampling, beams,
    n-gram rules, ...: :func:`~pipeline.runtime.generation.options.model_defaults`), which the module applies under a
    call's options as ``model.generate`` does. A field it sets that changes the tokens and that ``generate`` does not
    take (:data:`~pipeline.runtime.generation.options.NOT_TAKEN_DECODING`) is named in a warning: ``model.generate``
    applies it, the module decodes without it."""
    config = getattr(model, "generation_config", None)
    if config is None or not hasattr(config, "to_dict"):
        return ()
    defaults, others = model_defaults(config, capacity)
    ignored = [name for name in others if name in NOT_TAKEN_DECODING]
    if ignored:
        warnings.warn(
            f"the model's generation config sets {', '.join(f'{n}={getattr(config, n)!r}' for n in ignored)}, which "
            "the converted module's generate() does not take: model.generate applies it, the module decodes without "
            "it (set it to None in model.generation_config before converting to silence this)",
            stacklevel=3,
        )
    if defaults:
        logger.info(
            "generate() defaults from the model's generation config (as model.generate): %s",
            ", ".join(f"{name}={value!r}" for name, value in sorted(defaults.items())),
        )
    return tuple(sorted(defaults.items()))


def _configured(name: str, value: Any) -> tuple[int, ...]:
    """A token-id setting read from the model's generation config, checked as a given one is."""
    try:
        return token_ids(name, value, single=name == "pad_token_id")
    except InputError as error:
        raise InputError(
            f"the model's generation_config: {error.message}",
            fix=f"pass generation={{'{name}': ...}} with the tokenizer's id, or fix model.generation_config.{name}",
        ) from None


def _dynamic_dims(cache: list[str], batch: int, steps: int, max_batch: int, max_prompt: int) -> tuple[DynamicDim, ...]:
    names = ["input_ids", "attention_mask", "position_ids", *cache]
    dims: list[DynamicDim] = []
    if max_batch >= 2:
        dims += [DynamicDim(name, 0, "batch", 1, batch, max_batch) for name in names]
    if steps >= 2:
        dims += [DynamicDim(name, 1, "sequence", 1, steps, max_prompt) for name in _SEQUENCE_INPUTS]
    return tuple(dims)
