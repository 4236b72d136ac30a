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
name). The text step (:mod:`pipeline.generation.cross_step`): :class:`~pipeline.generation.step.CachedStep`'s
static self-attention cache (the layers that grew), the cross layers given (:class:`~pipeline.generation.seq2seq.
CrossCacheLayer`), the per-token masks and the other cross states as inputs. Its attention is the step's; an additive
float mask (both models turn their image masks into one) is given to it as a bias. The result is a
:class:`~pipeline.runtime.generation.cross_images.CrossImagesModule`, saved as an encoder-decoder directory. When
validating, each graph is validated against PyTorch on its own sample, then the sample's greedy decoding is compared
token for token with the model's own ``generate`` and every step's logits judged.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from converters.errors import InputError
from converters.generation_settings import GenerationSettings, check_token_ids, token_ids
from converters.registry import ConverterRegistry
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.conversion import (
    attention_form,
    check_attention_layers,
    check_sample_fits,
    model_options,
    special_tokens,
    step_precision_io,
)
from pipeline.generation.cross_layout import CrossLayout, cache_layers, cross_layout, state_at
from pipeline.generation.cross_step import CrossImagesStep, ones_of, step_profiles, step_sample
from pipeline.generation.generate_scores import (
    departed,
    follow_tokens,
    greedy_options,
    judged_departure,
    judged_logits,
    prompt_tokens,
    with_decoding,
)
from pipeline.generation.handed_prompt import handed_prompt
from pipeline.generation.ops import GENERATION_OPSET, generation_converters
from pipeline.generation.seq2seq import cache_of
from pipeline.generation.step_attention import uses_attention_interface
from pipeline.runtime.generation.cross_images import (
    PROMPT_EDIT,
    CrossImagesModule,
    edited_prompt,
    prefix_name,
)
from pipeline.runtime.generation.layout import cross_name
from pipeline.runtime.io_spec import normalise_sample
from pipeline.runtime.module import ConvertedModule
from pipeline.settings import DynamicDim, Settings

logger = logging.getLogger(__name__)

#: Convert one part (module, sample, settings, converters) through the stages.
Stages = Callable[[torch.nn.Module, Any, Settings, ConverterRegistry], ConvertedModule]

#: Tokens of the greedy decoding compared with the model's own ``generate`` when validating.
VALIDATION_TOKENS = 8
#: The module, as the validation's errors name it.
WHAT = "the converted model"
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
        model_options=(*model_options(model, generation.max_length), *options),
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
    sample_of_step, dims = step_sample(inputs, cross, layout, generation)
    step_settings = dataclasses.replace(
        settings,
        generation=generation,
        dynamic=dims,
        opset=max(settings.opset or GENERATION_OPSET, GENERATION_OPSET),
        profiles=step_profiles(generation),
        precision_io=precision_io,
        validation_inputs=0,  # drawn ids would not match the images: the sample's prompts are what it validates on
    )
    logger.info("cross-attended images: converting the text step (cache of %d tokens)", generation.max_length)
    step_module = stages(step, sample_of_step, step_settings, generation_converters(registry))
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
            fix=PLAIN_FORWARD,
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
    apart = departed(model, WHAT, wanted, chosen, settings.precision)
    if apart:  # a lower precision's near tie: the steps are judged on PyTorch's tokens, the departure reported
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
    if apart:
        judged = judged_departure(judged, model, WHAT, wanted, chosen, ids.shape[1], settings.precision)
    with_decoding(module.decoder, judged)
