"""``convert(vlm, {"input_ids": ..., "attention_mask": ..., "pixel_values": ...}, generation={...})``: a
vision-language decoder (LLaVA, PaliGemma, Gemma 3, Idefics3, Qwen2-VL, ...) as two converted graphs.

The vision graph (:mod:`pipeline.generation.vision_graph`): one image's inputs (``pixel_values`` and whatever else
the model's ``get_image_features`` takes per image) to its features in the text embedding space, [tokens, hidden]: the
vision tower and the projector, as the model's own ``get_image_features`` computes them. It runs once per image of a
request.

The cached text step (:mod:`pipeline.generation.vision_step`): the decoder-only step (:class:`~pipeline.generation.
step.CachedStep`) with one more input, ``image_features`` [image tokens, hidden]. The features replace the embeddings
of the model's image tokens (its config's ``image_token_id``) in order, row after row, as the model's own
``masked_scatter`` does; the step then calls the model with those embeddings. The placement is a gather (the n-th image
token takes the n-th feature) rather than ``masked_scatter``, whose ONNX form needs ``NonZero``: TensorRT's parser
refuses it. A model whose config names no image token is handed the features as its multimodal encoder's output
(transformers' ``mm_encoder_outputs``) and places them itself. A model that hands its embeddings to a causal LM
inside it and returns no cache of its own (BLIP-2) has its step call that language model
(:mod:`pipeline.generation.text_model`). A prompt leaves one position of the cache at least (``max_prompt`` is
``max_length - 1`` at most), so that code branching on "the prompt fills the cache" is one branch over the range.
The prompt's prefill takes every image's features; a decode step takes the image token's own text embedding, so that
a generated image token stays what the model's embedding makes it. Positions are the decoder-only step's
(``cumsum(attention_mask) - 1``, as the model's ``generate`` computes them), or, for a model that hands its text
decoder positions on several axes (M-RoPE), laid out per image as the model's own positions on the sample show
(:mod:`pipeline.generation.image_positions`). A text model whose cache keeps recurrent states (linear attention,
convolutions: Qwen3.5, LFM3-VL) gets the one-token step of :mod:`pipeline.generation.recurrent_state` with the same
``image_features`` input (:class:`~pipeline.generation.vision_step.RecurrentVisionLanguageStep`): the prompt is fed
token by token, an image token's step given its feature row. A model whose ``get_image_features`` also gives deepstack
features (Qwen3-VL's, Granite 4 Vision's: levels its text model adds at the image tokens between its decoder layers)
has the vision graph output them and the step add each where the model's own forward shows it adds it
(:mod:`pipeline.generation.deepstack`). An audio-language decoder (Voxtral, GLM-ASR, Audio Flamingo 3) takes the same
path with audio in place of images: its sample holds ``input_features``, the features graph is its
``get_audio_features`` and the placeholder its config's audio token (:class:`~pipeline.generation.vision_inputs.
Modality`); one whose forward computes its audio features (Qwen2-Audio) has the tower and projector found there
(:mod:`pipeline.generation.audio_features`). Features that differ on a second call (a tower that draws random numbers)
are refused. Nothing here reads one architecture's code.

The result is a :class:`~pipeline.runtime.generation.vision_language.VisionLanguageModule`. When validating, each graph
is validated against PyTorch on its own sample, then the sample's greedy decoding is compared token for token with
the model's own ``generate``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import torch

from converters.errors import InputError
from converters.generation_settings import check_token_ids
from converters.registry import ConverterRegistry
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.audio_features import check_repeatable
from pipeline.generation.conversion import (
    attention_form,
    check_attention_layers,
    check_sample_fits,
    model_options,
    names_recurrent_layers,
    one_token_prompt,
    special_tokens,
    step_precision_io,
)
from pipeline.generation.deepstack import BEFORE_LAYERS, DeepstackLevels, deepstack_layers
from pipeline.generation.generate_scores import (
    departed,
    follow_tokens,
    greedy_options,
    judged_departure,
    judged_logits,
    prompt_tokens,
    with_decoding,
)
from pipeline.generation.image_positions import image_positions
from pipeline.generation.kept_windows import kept_window_of
from pipeline.generation.ops import GENERATION_OPSET, generation_converters
from pipeline.generation.placement_check import check_placement, embeddings_receiver
from pipeline.generation.prompt_features import OwnPromptFeatures
from pipeline.generation.prompt_graph import probed_generation
from pipeline.generation.recurrent_state import FirstCallCache, RecurrentStep, StateLayer, cached_layers
from pipeline.generation.text_model import (
    check_takes_features,
    generate_feeds,
    ids_placed,
    language_model_of,
    modality_blocks,
    placement_input,
    position_offset,
)
from pipeline.generation.vision_graph import (
    Stages,
    convert_vision,
    features_of,
    image_token_id,
    pooled_features,
    token_embedding,
)
from pipeline.generation.vision_inputs import (
    features_parameters,
    fixed_inputs,
    image_features_method,
    modality_of,
    sample_inputs,
    takes_video_frames,
)
from pipeline.generation.vision_step import (
    RecurrentVisionLanguageStep,
    VisionLanguageStep,
    fit_mask,
    one_token_sample,
    runs_sample,
    step_profiles,
    step_sample,
)
from pipeline.runtime.generation.image_positions import image_rows
from pipeline.runtime.generation.vision_feed import TOKEN_TYPES, deepstack_name
from pipeline.runtime.generation.vision_language import VisionLanguageModule
from pipeline.settings import Settings

logger = logging.getLogger(__name__)

#: Tokens of the greedy decoding compared with the model's own ``generate`` when validating.
VALIDATION_TOKENS = 8
#: The module, as the validation's errors name it.
WHAT = "the converted vision-language model"


def convert_vision_language(
    model: torch.nn.Module, sample: Any, settings: Settings, registry: ConverterRegistry, stages: Stages
) -> VisionLanguageModule:
    """The vision graph and the cached text step of ``model``, converted (see the module docstring)."""
    generation = settings.generation
    assert generation is not None
    text, vision = sample_inputs(model, sample)
    options = fixed_inputs(model, sample)  # the sample's scalars the forward takes (sample=False): every call's
    input_ids = text["input_ids"]
    check_sample_fits(input_ids, generation, settings.validate)
    modality = modality_of(vision)
    token = image_token_id(model, modality)
    check_attention_layers(model, states=True)
    # a text model with recurrent layers is handed a cache whose length is known when no layer attends
    first = FirstCallCache(config=getattr(model, "config", None)) if names_recurrent_layers(model) else None
    check_placement(model, text, vision, token, options)  # the forward's placement; its features method's inputs
    with torch.no_grad():
        features, levels = features_of(model, vision, options)
        again = features_of(model, vision, options)[0]
        check_repeatable(model, modality, features, again, features_parameters(model, modality))
        placement = placement_input(model, text, int(features.shape[0])) if token is None else None
        layout, vocabulary, language = language_model_of(model, text, vision, placement is not None, first)
    check_takes_features(model, language, token, placement)
    generation = dataclasses.replace(generation, kept_window=kept_window_of(model, layout))
    states = any(isinstance(layer, StateLayer) for layer in layout)
    if states:
        check_one_token(model, token, placement, TOKEN_TYPES in text)
    if placement is not None:
        logger.info("vision-language: the image features go where the sample's %s marks", placement)
        text = {**text, placement: text[placement].to(torch.int64)}
    positions = image_positions(model, {**text, **vision}, token)
    if positions is not None:
        logger.info("vision-language: positions on %d axes (an image takes %s)", positions.axes, positions.block.shape)
    hidden = int(features.shape[-1])
    pooled = pooled_features(model, image_rows(vision)[0], options)
    listed = isinstance(pooled, list | tuple)
    # the language model's generate decides eos and padding where the model's hands it the embeddings (BLIP-2's)
    eos, pad = special_tokens(language, generation.eos_token_id, generation.pad_token_id)
    from_model = tuple(n for n in ("eos_token_id", "pad_token_id") if getattr(generation, n) in ((), None))
    generation = dataclasses.replace(
        one_token_prompt(model, generation) if states else generation,
        layers=cached_layers(layout) if states else len(layout),
        eos_token_id=eos,
        pad_token_id=pad,
        attention=attention_form(model, settings, layout),
        fixed_inputs=tuple(options.items()),
        model_options=model_options(language, generation.max_length),  # whose generate decides them, as eos
    )
    generation = check_token_ids(generation, vocabulary, from_model)
    precision_io = step_precision_io(settings)
    vision_settings = dataclasses.replace(settings, generation=None, dynamic=(), profiles=(), precision_io=precision_io)
    logger.info(
        "vision-language: converting the %s graph (%s -> %s features)", modality.name, ", ".join(vision), modality.name
    )
    # the text decoder's attention is the step's: a tower's own attention code (GOT-OCR2's) does not decide it
    get_decoder = getattr(language, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    text_model = decoder if isinstance(decoder, torch.nn.Module) else language
    by_token = states or placement is not None
    deepstack = _deepstack(model, text_model, text, vision, token, levels, by_token, pooled is None)
    stacked = deepstack.levels if deepstack is not None else ()
    vision_module, fixed = convert_vision(model, vision, vision_settings, registry, stages, stacked, options)
    from pipeline.generation.placeholders import placeholder_rows
    from pipeline.generation.step import indexed_layers
    from pipeline.generation.step_attention import uses_attention_interface

    typed = TOKEN_TYPES in text
    if not states and (generation.max_prompt or generation.max_length) >= generation.max_length:
        # a prompt leaves one position of the cache at least (a prompt that fills it leaves no room for a decode
        # step). Code that cuts the prompt's columns off the cache-wide mask (LFM2's `attention_mask[:, -tokens:]`)
        # or pads the image blocks' ids up to the cache's length when the prompt is shorter (transformers' token
        # types) branches on "the prompt fills the cache": torch.export holds that branch over the range
        generation = dataclasses.replace(generation, max_prompt=generation.max_length - 1)
    step: VisionLanguageStep
    if states and generation.prompt_tokens:  # the text model's runs continue from the states (probed on text alone)
        assert token is not None  # check_one_token
        ids = text["input_ids"]
        words = ids[ids != token]
        plain = words[:1].expand_as(ids).clone() if words.numel() else torch.zeros_like(ids)
        plain = torch.where(torch.eq(ids, token), plain, ids)
        probe = RecurrentStep(language, layout, False)
        generation = probed_generation(language, probe, layout, plain, generation, settings.generation)
    if states:
        assert token is not None  # check_one_token
        step = RecurrentVisionLanguageStep(language, layout, uses_attention_interface(text_model), listed, token)
        sample_of_step, dims = one_token_sample(text, features, layout, generation, token, positions)
    else:
        step = VisionLanguageStep(
            language,
            len(layout),
            uses_attention_interface(text_model),
            listed,
            token,
            typed,
            placement,
            deepstack,
            text_model,
            indexed_layers(layout),
        )
        named = {deepstack_name(level): levels[level] for level in stacked}
        sample_of_step, dims = step_sample(text, features, layout, generation, positions, placement, named)
    step = step.train(model.training)
    step.ids_placed = not states and ids_placed(model, language, text, token, features)
    receiver = (
        None
        if states or step.ids_placed or language is not model
        else embeddings_receiver(model, text, {**vision, **options}, token, features)
    )
    step.placed_at, step.ids_placed = ([receiver], True) if receiver is not None else ([], step.ids_placed)
    if not states and not step.ids_placed and language is model and token is not None:
        step.placeholder_ids, step.placeholder_rows = placeholder_rows(model, token)
    if not states and positions is None and language is model:
        with torch.no_grad():
            step.modality_kind = modality_blocks(model, text, vision, token)
    if placement is not None:
        handed, cached = generate_feeds(model, text, vision)
        if not handed:  # the model computes its own: from its cache's length, or over the whole sequence each time
            step.position_offset = None if cached else position_offset(language, text)
        fit_mask(step, sample_of_step)
    step_settings = dataclasses.replace(
        settings,
        generation=generation,
        dynamic=dims,
        opset=max(settings.opset or GENERATION_OPSET, GENERATION_OPSET),
        profiles=() if states else step_profiles(dims, generation),  # one token: the one profile of ``dims``
        precision_io=precision_io,
        validation_inputs=0,  # drawn ids would not match the images: the sample's prompts are what it validates on
        # an image block attends both ways in the prefill: ONNX Runtime's GroupQueryAttention masks causally itself
        ort_grouped_attention=settings.ort_grouped_attention and not typed and step.modality_kind is None,
    )
    if typed and settings.ort_grouped_attention:
        logger.info("vision-language: token_type_ids: the step runs ONNX Attention (GroupQueryAttention is causal)")
    logger.info("vision-language: converting the text step (cache of %d tokens)", generation.max_length)
    step_module = stages(step, sample_of_step, step_settings, generation_converters(registry))
    if states and generation.prompt_tokens:  # its prompt graph (pipeline/generation/prompt_graph.py)
        assert token is not None  # check_one_token
        runs, runs_dims = runs_sample(text, features, layout, generation, token, positions)
        logger.info("vision-language: converting the prompt graph (%d tokens per run)", generation.prompt_tokens)
        prompt_settings = dataclasses.replace(step_settings, dynamic=runs_dims)
        step_module.hold_prompt_graph(stages(step, runs, prompt_settings, generation_converters(registry)))
    embedding = token_embedding(model, token, hidden)
    placeholder = "video" if takes_video_frames(model, modality) else modality.name  # the token image_token_id read
    own_runs = isinstance(image_features_method(model, modality), OwnPromptFeatures)  # each item in a prompt of its own
    module = VisionLanguageModule(
        vision_module, step_module, token, embedding, fixed, positions, modality.name, placeholder, own_runs
    )
    if settings.validate:
        _validate_greedy(model, module, text, {**vision, **options}, step_settings)
    return module


def _deepstack(
    model: torch.nn.Module,
    text_model: torch.nn.Module,
    text: dict[str, torch.Tensor],
    vision: dict[str, torch.Tensor],
    token: int | None,
    levels: list[torch.Tensor],
    by_token: bool,
    zeroed: bool,
) -> DeepstackLevels | None:
    """Where the model adds its deepstack ``levels`` (:func:`~pipeline.generation.deepstack.deepstack_layers`), None
    when it gives none or adds none (a small config's tower that reaches none of its deepstack layers); an InputError
    for a model whose step cannot place them: without an image token (``token``), or fed a token at a time
    (``by_token``: a text model with recurrent states, or images marked by an input of the model's own). ``zeroed``:
    the model gives levels only (its image tokens' embeddings zeroed, then a level added before its first layer)."""
    if not levels:
        return None
    name = type(model).__name__
    if token is None or by_token:
        raise InputError(
            f"{name}.get_image_features also returns deepstack features ({len(levels)} levels), which the model adds "
            "inside its decoder layers at the image tokens; the step adds them at the image tokens of a whole prompt "
            "given by the config's image token, which "
            + (
                "this model's config does not name" if token is None else "this step (one token at a time) does not see"
            ),
            fix=PLAIN_FORWARD,
        )
    with torch.no_grad():
        is_image = text["input_ids"] == token
        deepstack = deepstack_layers(model, text_model, {**text, **vision}, is_image, levels, zeroed)
    if not deepstack.after:
        logger.info("vision-language: %s's %d deepstack levels are added after no decoder layer", name, len(levels))
        return None
    logger.info(
        "vision-language: deepstack levels added after decoder layers (layer: levels) %s",
        ", ".join(
            f"{'before the first' if layer == BEFORE_LAYERS else layer}: {list(added)}"
            for layer, added in sorted(deepstack.after.items())
        ),
    )
    return deepstack


def check_one_token(model: torch.nn.Module, token: int | None, placement: str | None, typed: bool) -> None:
    """An InputError for a model with recurrent layers that the one-token step cannot feed its images as the model
    does: without an image token to place features at (the model places them itself over a whole prompt, or where a
    per-token input marks), or with token types (an image block attending both ways within one prefill call)."""
    name = type(model).__name__
    if token is None:
        raise InputError(
            f"{name}'s text model keeps recurrent states, so its step takes one token at a time, and its config names "
            f"no image token to place an image feature at ({'marked by ' + placement if placement else 'the model'} "
            "places its features over a whole prompt)",
            fix=PLAIN_FORWARD,
        )
    if typed:
        raise InputError(
            f"{name}'s text model keeps recurrent states, so its step takes one token at a time, but its "
            "token_type_ids make an image's tokens attend to each other both ways within the prompt's one call",
            fix=PLAIN_FORWARD,
        )


def _validate_greedy(
    model: torch.nn.Module,
    module: VisionLanguageModule,
    text: dict[str, torch.Tensor],
    vision: dict[str, Any],
    settings: Settings,
) -> None:
    """The sample's greedy decoding, token for token against ``model.generate``, then every step's logits
    (:mod:`pipeline.generation.generate_scores`): the step's report holds them as its ``decoding``."""
    options = greedy_options(VALIDATION_TOKENS)
    with torch.no_grad():
        expected = model.generate(**text, **vision, **options)  # type: ignore[operator]
    actual: Any = module.generate(**text, **vision, **options)
    wanted = torch.as_tensor(getattr(expected, "sequences", expected))  # a generate that returns no dict: tokens
    chosen = actual.sequences
    apart = departed(model, WHAT, wanted, chosen, settings.precision)
    if apart:  # a lower precision's near tie: the steps are judged on PyTorch's tokens, the departure reported
        actual = module.generate(**text, **vision, **options, logits_processor=follow_tokens(wanted))
    ids = text["input_ids"]
    label = f"sample {ids.shape[0]}x{ids.shape[1]} with its images"
    tokens = prompt_tokens(text.get("attention_mask"), ids)
    generate: Any = getattr(model, "generate")  # noqa: B009 - nn.Module types it as a tensor
    again = functools.partial(generate, **text, **vision, **options)
    judged = judged_logits(actual, expected, module.step.io, settings, label, tokens, again, model)
    if apart:
        judged = judged_departure(judged, model, WHAT, wanted, chosen, ids.shape[1], settings.precision)
    with_decoding(module.step, judged)
