"""``convert(vlm, {"input_ids": ..., "attention_mask": ..., "pixel_values": ...}, generation={...})``: a
vision-language decoder (LLaVA, PaliGemma, Gemma 3, Idefics3, Qwen2-VL, ...) as two converted graphs.

:class:`ImageFeatures` is the vision graph: one image's inputs (``pixel_values`` and whatever else the model's
``get_image_features`` takes per image) to its features in the text embedding space, [tokens, hidden]: the vision
tower and the projector, as the model's own ``get_image_features`` computes them. It runs once per image of a request.
Images are cut apart by :func:`~pipeline.runtime.generation.image_positions.image_rows` (one leading row each, or the
flattened patches an integer grid divides: Qwen2-VL's ``image_grid_thw``); an integer input the tower decides shapes
from in Python is held at the sample's first image's values, known while tracing
(:class:`~pipeline.generation.known_values.KnownValues`).

:class:`VisionLanguageStep` is the cached text step of the decoder-only path (:class:`~pipeline.generation.step.
CachedStep`) with one more input, ``image_features`` [image tokens, hidden]. The features replace the embeddings of
the model's image tokens (its config's ``image_token_id``) in order, row after row, as the model's own
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
(:mod:`pipeline.generation.image_positions`). Nothing here reads one architecture's code.

The result is a :class:`~pipeline.runtime.generation.vision_language.VisionLanguageModule`. When validating, each graph
is validated against PyTorch on its own sample, then the sample's greedy decoding is compared token for token with
the model's own ``generate``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from converters.errors import AccuracyError, ExportError, InputError
from converters.generation_settings import GenerationSettings, check_token_ids
from converters.registry import ConverterRegistry
from converters.settings import ProfileRange
from pipeline.generation.conversion import (
    attention_form,
    check_attention_layers,
    check_sample_fits,
    special_tokens,
    step_precision_io,
)
from pipeline.generation.generate_scores import (
    GROSS,
    diverged,
    follow_tokens,
    greedy_options,
    judged_logits,
    prompt_tokens,
    with_decoding,
)
from pipeline.generation.image_positions import image_positions
from pipeline.generation.known_values import KnownValues
from pipeline.generation.ops import GENERATION_OPSET, generation_converters, on_tensorrt
from pipeline.generation.step import CachedStep
from pipeline.generation.text_model import (
    check_takes_features,
    generate_feeds,
    language_model_of,
    placement_input,
    position_offset,
)
from pipeline.generation.vision_inputs import image_features_method, sample_inputs
from pipeline.runtime.generation.image_positions import ImagePositions, image_rows
from pipeline.runtime.generation.layout import CachedLayer, past_name
from pipeline.runtime.generation.vision_language import IMAGE_FEATURES, TOKEN_TYPES, VisionLanguageModule
from pipeline.runtime.module import ConvertedModule
from pipeline.settings import DynamicDim, Settings

logger = logging.getLogger(__name__)

#: Convert one part (module, sample, settings, converters) through the stages.
Stages = Callable[[torch.nn.Module, Any, Settings, ConverterRegistry], ConvertedModule]

#: Tokens of the greedy decoding compared with the model's own ``generate`` when validating.
VALIDATION_TOKENS = 8


class ImageFeatures(torch.nn.Module):
    """The vision graph: one image's inputs (``names``, in order) to its features [tokens, hidden], the model's own
    ``get_image_features`` (tower and projector) with the per-image pieces joined as the model joins them."""

    def __init__(
        self, model: torch.nn.Module, names: tuple[str, ...], fixed: dict[str, torch.Tensor] | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.names = names
        self.fixed = dict(fixed or {})  # inputs held at one image's values (constants of the graph)
        #: graph input names of the ``*inputs`` arguments (the exporter reads this mapping)
        self.onnx_input_names = {f"inputs_{i}": name for i, name in enumerate(names)}
        if len(names) == 1:  # the exporter names a lone variadic argument after the parameter
            self.onnx_input_names["inputs"] = names[0]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The image's features in the text embedding space."""
        # known while tracing: a tensor constant is still data to torch.export, which cannot decide shapes from it
        with KnownValues() as known:
            fixed = {name: known.tensor(value) for name, value in self.fixed.items()}
            return image_features(self.model, {**dict(zip(self.names, inputs, strict=True)), **fixed})


def image_features(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """``model.get_image_features(**inputs)`` as one tensor [tokens, hidden] (what the model scatters over its image
    tokens: the pieces of a list joined in order, a tensor's leading axes flattened)."""
    out = image_features_method(model)(**inputs, return_dict=True)
    pooled = getattr(out, "pooler_output", out)
    if isinstance(pooled, list | tuple):
        pooled = torch.cat([piece.reshape(-1, piece.shape[-1]) for piece in pooled], dim=0)
    if not isinstance(pooled, torch.Tensor):
        raise InputError(
            f"{type(model).__name__}.get_image_features returned {type(pooled).__name__}, not the image features",
            fix="generation= converts image-text-to-text models whose get_image_features returns the features",
        )
    return pooled.reshape(-1, pooled.shape[-1])


class VisionLanguageStep(CachedStep):
    """The cached text step with the prompt's image features (see the module docstring).

    ``forward(input_ids, attention_mask, position_ids, past_length, image_features, *past)``. With the model's
    ``image_token`` known, the features replace the embeddings of the image tokens, in order (what the model's
    ``masked_scatter`` does, written as a gather: no ``NonZero``, which TensorRT's parser refuses), and the model is
    called with the embeddings; without it, the features are handed to the model as its multimodal encoder's output
    (``listed``: as a list, LLaVA's ``pooler_output``), and the model places them itself."""

    def __init__(
        self,
        model: torch.nn.Module,
        layers: int,
        use_interface: bool,
        listed: bool,
        image_token: int | None,
        typed: bool = False,
        placement: str | None = None,
    ) -> None:
        super().__init__(model, layers, use_interface)
        self.listed = listed
        self.image_token = image_token
        #: ``token_type_ids`` [B, S] is an input after ``image_features`` (the model's forward takes them): zeros in
        #: a decode step, the prompt's in the prefill
        self.typed = typed
        self.prefill_masks = typed
        #: the model's per-token input marking the image tokens (Kosmos-2's ``image_embeds_position_mask``), an input
        #: after ``image_features`` (before the token types): the prompt's in the prefill, zeros in a decode step
        self.placement = placement
        names = [past_name(i, kind) for i in range(layers) for kind in ("key", "value")]
        firsts = ([placement] if placement else []) + ([TOKEN_TYPES] if typed else [])
        self.onnx_input_names = {f"rest_{i}": name for i, name in enumerate(firsts + names)}

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_length: torch.Tensor,
        image_features: torch.Tensor,
        *rest: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """The step: logits of the last position and the updated cache (``rest``: the token types when
        :attr:`typed`, then the cache)."""
        marked, rest = (rest[0], rest[1:]) if self.placement else (None, rest)
        types, past = (rest[0], rest[1:]) if self.typed else (None, rest)
        if marked is not None:
            with placed_in_embeddings(self.model, marked != 0, image_features):
                return self.run({"input_ids": input_ids}, attention_mask, position_ids, past_length, past)
        inputs = self._inputs(input_ids, image_features)
        if types is not None:
            inputs[TOKEN_TYPES] = types
        return self.run(inputs, attention_mask, position_ids, past_length, past)

    def _inputs(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> dict[str, Any]:
        """The model's inputs for the tokens and the features (see the class docstring)."""
        if self.image_token is None:
            from transformers.modeling_outputs import BaseModelOutputWithPooling

            pooled: Any = [image_features] if self.listed else image_features
            return {
                "input_ids": input_ids,
                "mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=pooled)},
            }
        embeddings = self.model.get_input_embeddings()(input_ids)  # type: ignore[operator]
        return {"inputs_embeds": placed_features(embeddings, input_ids == self.image_token, image_features)}


def placed_features(embeddings: torch.Tensor, is_image: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``embeddings`` [B, S, hidden] with the n-th marked token (row after row) taking the n-th row of ``features``,
    as ``masked_scatter`` fills it; written as a gather (no ``NonZero``)."""
    order = is_image.reshape(-1).to(torch.int64).cumsum(0) - 1
    order = order.clamp(min=0).clamp(max=features.shape[0] - 1)
    placed = features.to(embeddings.dtype).index_select(0, order).reshape(embeddings.shape)
    return torch.where(is_image.unsqueeze(-1), placed, embeddings)


@contextlib.contextmanager
def placed_in_embeddings(model: torch.nn.Module, is_image: torch.Tensor, features: torch.Tensor) -> Iterator[None]:
    """Within the block, the model's input embedding gives the image features at the marked tokens: the model is
    called with its ``input_ids`` (from which it may compute its own positions) and finds the features where it
    would place them itself (Kosmos-2 places them before it scales the embeddings, as this does)."""

    def place(_module: torch.nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
        return placed_features(out, is_image, features)

    embedding = model.get_input_embeddings()  # type: ignore[operator]
    handle = embedding.register_forward_hook(place)
    try:
        yield
    finally:
        handle.remove()


def convert_vision_language(
    model: torch.nn.Module, sample: Any, settings: Settings, registry: ConverterRegistry, stages: Stages
) -> VisionLanguageModule:
    """The vision graph and the cached text step of ``model``, converted (see the module docstring)."""
    generation = settings.generation
    assert generation is not None
    text, vision = sample_inputs(model, sample)
    input_ids = text["input_ids"]
    check_sample_fits(input_ids, generation, settings.validate)
    token = image_token_id(model)
    check_attention_layers(model)
    with torch.no_grad():
        features = _features_of(model, vision)
        placement = placement_input(model, text, int(features.shape[0])) if token is None else None
        layout, vocabulary, language = language_model_of(model, text, vision, inner_first=placement is not None)
    check_takes_features(model, language, token, placement)
    if placement is not None:
        logger.info("vision-language: the image features go where the sample's %s marks", placement)
        text = {**text, placement: text[placement].to(torch.int64)}
    positions = image_positions(model, {**text, **vision}, token)
    if positions is not None:
        logger.info("vision-language: positions on %d axes (an image takes %s)", positions.axes, positions.block.shape)
    hidden = int(features.shape[-1])
    listed = isinstance(_pooled(model, image_rows(vision)[0]), list | tuple)
    # the language model's generate decides eos and padding where the model's hands it the embeddings (BLIP-2's)
    eos, pad = special_tokens(language, generation.eos_token_id, generation.pad_token_id)
    from_model = tuple(n for n in ("eos_token_id", "pad_token_id") if getattr(generation, n) in ((), None))
    generation = dataclasses.replace(
        generation,
        layers=len(layout),
        eos_token_id=eos,
        pad_token_id=pad,
        attention=attention_form(model, settings, layout),
    )
    generation = check_token_ids(generation, vocabulary, from_model)
    precision_io = step_precision_io(settings)
    vision_settings = dataclasses.replace(settings, generation=None, dynamic=(), profiles=(), precision_io=precision_io)
    logger.info("vision-language: converting the vision graph (%s -> image features)", ", ".join(vision))
    vision_module, fixed = _convert_vision(model, vision, vision_settings, registry, stages)
    from pipeline.generation.step import uses_attention_interface

    typed = TOKEN_TYPES in text
    if (generation.max_prompt or generation.max_length) >= generation.max_length:
        # a prompt leaves one position of the cache at least (a prompt that fills it leaves no room for a decode
        # step). Code that cuts the prompt's columns off the cache-wide mask (LFM2's `attention_mask[:, -tokens:]`)
        # or pads the image blocks' ids up to the cache's length when the prompt is shorter (transformers' token
        # types) branches on "the prompt fills the cache": torch.export holds that branch over the range
        generation = dataclasses.replace(generation, max_prompt=generation.max_length - 1)
    # the text decoder's attention is the step's: a tower's own attention code (GOT-OCR2's) does not decide it
    get_decoder = getattr(language, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    text_model = decoder if isinstance(decoder, torch.nn.Module) else language
    step = VisionLanguageStep(
        language, len(layout), uses_attention_interface(text_model), listed, token, typed, placement
    )
    step = step.train(model.training)
    step_sample, dims = _step_sample(text, features, layout, generation, positions, placement)
    if placement is not None:
        handed, cached = generate_feeds(model, text, vision)
        if not handed:  # the model computes its own: from its cache's length, or over the whole sequence each time
            step.position_offset = None if cached else position_offset(language, text)
        _fit_mask(step, step_sample)
    step_settings = dataclasses.replace(
        settings,
        generation=generation,
        dynamic=dims,
        opset=max(settings.opset or GENERATION_OPSET, GENERATION_OPSET),
        profiles=_profiles(dims, generation),
        precision_io=precision_io,
        validation_inputs=0,  # drawn ids would not match the images: the sample's prompts are what it validates on
        # an image block attends both ways in the prefill: ONNX Runtime's GroupQueryAttention masks causally itself
        ort_grouped_attention=settings.ort_grouped_attention and not typed,
    )
    if typed and settings.ort_grouped_attention:
        logger.info("vision-language: token_type_ids: the step runs ONNX Attention (GroupQueryAttention is causal)")
    logger.info("vision-language: converting the text step (cache of %d tokens)", generation.max_length)
    step_module = stages(step, step_sample, step_settings, generation_converters(registry))
    embedding = _token_embedding(model, token, hidden)
    module = VisionLanguageModule(vision_module, step_module, token, embedding, fixed, positions)
    if settings.validate:
        _validate_greedy(model, module, text, vision, step_settings)
    return module


def _convert_vision(
    model: torch.nn.Module,
    vision: dict[str, torch.Tensor],
    settings: Settings,
    registry: ConverterRegistry,
    stages: Stages,
) -> tuple[ConvertedModule, dict[str, torch.Tensor]]:
    """The vision graph, and the integer inputs it holds at the sample's first image's values (none unless needed). A
    tower whose code decides shapes in Python from an integer input (LLaVA-NeXT's and Pixtral's ``image_sizes``)
    cannot export it as data: the graph is converted again with those inputs fixed, and takes images of that size.
    So is a graph for TensorRT that selects features by a mask (``NonZero``, which TensorRT's parser refuses): where
    the mask is computed from the integer inputs (LFM2-VL drops its padding token slots by the image's
    ``spatial_shapes``), it is a constant of the graph with them fixed, and TensorRT takes those inputs' values from
    the sample anyway (shape tensors)."""
    image = image_rows(vision)[0]
    fixed = {name: value for name, value in image.items() if not value.is_floating_point()}
    why = "decides shapes from"
    try:
        part = ImageFeatures(model, tuple(vision)).train(model.training)
        converted = stages(part, tuple(image.values()), settings, registry)
        if not fixed or not on_tensorrt(settings) or not _selects_by_mask(converted):
            return converted, {}
        why = "selects its features by a mask computed from"
    except ExportError as error:
        if not fixed or "data-dependent" not in str(error):
            raise
        converted = None
    logger.warning(
        "%s's vision tower %s %s in Python: the vision graph holds them at the sample's values %s "
        "(it takes images processed to that size)",
        type(model).__name__,
        why,
        ", ".join(fixed),
        {name: value.tolist() for name, value in fixed.items()},
    )
    names = tuple(name for name in image if name not in fixed)
    part = ImageFeatures(model, names, fixed).train(model.training)
    held = stages(part, tuple(image[name] for name in names), settings, registry)
    if converted is not None and _selects_by_mask(held):  # the mask is the pixels': the graph as it was
        return converted, {}
    return held, fixed


def _selects_by_mask(module: ConvertedModule) -> bool:
    """Whether the converted graph selects elements by a mask (``NonZero``)."""
    return any(node.op_type == "NonZero" for node in module.onnx.graph.node)


def image_token_id(model: torch.nn.Module) -> int | None:
    """The token the model places image features at (its config's ``image_token_id``, or ``image_token_index``)."""
    config = getattr(model, "config", None)
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _token_embedding(model: torch.nn.Module, token: int | None, hidden: int) -> torch.Tensor:
    """The model's text embedding of its image token [hidden] (zeros without one): a decode step's features."""
    embeddings = getattr(model, "get_input_embeddings", None)
    if token is None or not callable(embeddings):
        return torch.zeros(hidden)
    with torch.no_grad():
        row = embeddings()(torch.tensor([token], dtype=torch.int64))
    return row.reshape(-1).float() if row.numel() == hidden else torch.zeros(hidden)


def _pooled(model: torch.nn.Module, image: dict[str, torch.Tensor]) -> Any:
    """The features ``get_image_features`` gives one image (its ``pooler_output``); an InputError when it also gives
    features the model adds elsewhere than at the image tokens' embeddings (Qwen3-VL's deepstack)."""
    with torch.no_grad():
        out = image_features_method(model)(**image, return_dict=True)
    keys = getattr(out, "keys", None)
    for field in keys() if callable(keys) else ():
        value = out[field]
        if field not in _PLACED_OUTPUTS and isinstance(value, list | tuple) and value:
            raise InputError(
                f"{type(model).__name__}.get_image_features also returns {field} ({len(value)}), which the model adds "
                "inside its decoder layers at the image tokens (Qwen3-VL's deepstack); the cached step places the "
                "image features in the embeddings only, and would decode otherwise than the model",
                fix="convert without generation= (the plain forward), or a model whose images enter at the embeddings",
            )
    return getattr(out, "pooler_output", out)


#: Fields of ``get_image_features``' output the step accounts for (the features it places, and the tower's own).
_PLACED_OUTPUTS = ("pooler_output", "last_hidden_state", "hidden_states", "attentions")


def _features_of(model: torch.nn.Module, vision: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every image's features, one image at a time (as the vision graph runs), joined in order [tokens, hidden]."""
    try:
        return torch.cat([image_features(model, image) for image in image_rows(vision)], dim=0)
    except InputError:
        raise
    except Exception as error:  # noqa: BLE001 - the model refusing one image at a time: said with its cause
        raise InputError(
            f"{type(model).__name__}.get_image_features fails on one image of the sample: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:300]}",
            fix="pass the processor's image inputs (one leading row per image)",
        ) from error


def _step_sample(
    text: dict[str, torch.Tensor],
    features: torch.Tensor,
    layout: list[CachedLayer],
    generation: GenerationSettings,
    laid: ImagePositions | None = None,
    placement: str | None = None,
) -> tuple[Any, tuple[DynamicDim, ...]]:
    """The step's sample (the sample's prompts prefilled with their image features) and its dynamic dimensions: the
    batch, the sequence and the image tokens. With ``laid``, positions have an axis dimension first; with
    ``placement``, the step takes that per-token input after the features."""
    ids, mask, types = text["input_ids"], text["attention_mask"], text.get(TOKEN_TYPES)
    marked = text[placement] if placement else None
    if ids.shape[0] == 1 and generation.max_batch >= 2:  # the export specialises a batch of 1: the row twice
        ids, mask, features = ids.expand(2, -1).clone(), mask.expand(2, -1).clone(), features.repeat(2, 1)
        types = types.expand(2, -1).clone() if types is not None else None
        marked = marked.expand(2, -1).clone() if marked is not None else None
    rows, steps = ids.shape
    capacity = generation.max_length
    full = torch.zeros(rows, capacity, dtype=torch.int64)
    full[:, :steps] = mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1) if laid is None else laid.prompt(ids, mask)
    past = [tensor for layer in layout for tensor in layer.storage(rows, capacity)]
    typed = [types] if types is not None else []
    per_token = ([marked] if marked is not None else []) + typed
    sample: Any = ((ids, full, positions, torch.tensor(0, dtype=torch.int64), features, *per_token, *past), {})
    token_inputs = ([placement] if placement else []) + ([TOKEN_TYPES] if typed else [])
    names = ["input_ids", "attention_mask", "position_ids", *token_inputs]
    names += [past_name(i, kind) for i in range(len(layout)) for kind in ("key", "value")]
    longest = generation.max_prompt or capacity
    dims: list[DynamicDim] = []
    axis = {"position_ids": 0 if laid is None else 1}  # the positions' batch axis
    if generation.max_batch >= 2:
        dims += [DynamicDim(name, axis.get(name, 0), "batch", 1, rows, generation.max_batch) for name in names]
    sequences = ("input_ids", "position_ids", *token_inputs)
    dims += [DynamicDim(name, axis.get(name, 0) + 1, "sequence", 1, steps, longest) for name in sequences]
    most = max(longest * generation.max_batch, features.shape[0])
    dims.append(DynamicDim(IMAGE_FEATURES, 0, "image_tokens", 1, int(features.shape[0]), most))
    return sample, tuple(dims)


def _fit_mask(step: VisionLanguageStep, sample: Any) -> None:
    """Whether the model builds its own mask over the keys it has seen rather than over the static cache (Kosmos-2's
    additive mask over past and new keys): the step run once eagerly on its sample fails with the cache-wide mask
    and runs with the step's own (:attr:`~pipeline.generation.step.CachedStep.own_mask`). Such a model decides in
    Python from the cache's length (``if cache_length > 0``), and may grow tables lazily from it (Kosmos-2's
    sinusoidal positions): the step is run once more over a longer cache, at its end, so that the export finds the
    table long enough, and the export traces the model's branches on the length on their general side
    (:meth:`~pipeline.generation.step.CachedStep.run`)."""
    args, _ = sample
    with torch.no_grad():
        try:
            step(*args)
            return
        except (RuntimeError, TypeError) as error:
            failure = error
        step.own_mask = True
        try:
            step(*args)
        except Exception:  # noqa: BLE001 - neither mask: the export says why, on the model's own mask
            step.own_mask = False
            return
        # a lazily grown table covers every length the trace may compare with it (the prompt's and the cache's
        # longest together): the step run once over a cache twice as long, at its end
        rows, steps, longer = int(args[0].shape[0]), int(args[0].shape[1]), 2 * int(args[1].shape[-1])
        cache = args[len(args) - 2 * step.layers :]
        cache = tuple(torch.zeros((*t.shape[:-2], longer, t.shape[-1]), dtype=t.dtype) for t in cache)
        mask = torch.ones(rows, longer, dtype=torch.int64)
        length = torch.tensor(longer - steps, dtype=torch.int64)
        step(args[0], mask, args[2], length, *args[4 : len(args) - 2 * step.layers], *cache)
    logger.info(
        "vision-language: %s builds its own mask over the keys it has seen (%s: %.120s): the step's attention takes "
        "the step's causal mask over the cache",
        type(step.model).__name__,
        type(failure).__name__,
        str(failure),
    )


def _profiles(dims: tuple[DynamicDim, ...], generation: GenerationSettings) -> tuple[tuple[ProfileRange, ...], ...]:
    """Context (the prompt with its images) and generation (one token, one row of zeros for features)."""
    longest = generation.max_prompt or generation.max_length
    images = next(d for d in dims if d.name == "image_tokens")
    context = (
        ProfileRange("sequence", 1, min(longest, 64), longest),
        ProfileRange("image_tokens", 1, images.opt, images.max),
    )
    rows = ProfileRange("image_tokens", 1, 1, generation.max_batch)  # a decode step: one embedding row per batch row
    return (context, (ProfileRange("sequence", 1, 1, 1), rows))


def _validate_greedy(
    model: torch.nn.Module,
    module: VisionLanguageModule,
    text: dict[str, torch.Tensor],
    vision: dict[str, torch.Tensor],
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
    departed = not torch.equal(wanted, chosen)
    if departed and (settings.precision == "fp32" or wanted.shape[1] > chosen.shape[1]):
        raise AccuracyError(
            f"the converted vision-language model's greedy tokens differ from {type(model).__name__}.generate on the "
            f"sample: expected {wanted.tolist()}, got {chosen.tolist()}",
            fix="convert with precision='fp32' to confirm; report the model (each graph passed its validation)",
        )
    if departed:  # a lower precision's near tie: the steps are judged on PyTorch's tokens, the departure reported
        actual = module.generate(**text, **vision, **options, logits_processor=follow_tokens(wanted))
    ids = text["input_ids"]
    label = f"sample {ids.shape[0]}x{ids.shape[1]} with its images"
    tokens = prompt_tokens(text.get("attention_mask"), ids)
    generate: Any = getattr(model, "generate")  # noqa: B009 - nn.Module types it as a tensor
    again = functools.partial(generate, **text, **vision, **options)
    judged = judged_logits(actual, expected, module.step.io, settings, label, tokens, again, model)
    worst = None if judged is None else judged.worst_step
    if departed and (worst is None or worst.max_abs > GROSS * worst.atol_used):  # not a near tie: a wrong step
        raise AccuracyError(
            f"the converted vision-language model's greedy tokens differ from {type(model).__name__}.generate on the "
            f"sample ({settings.precision}), and its logits fed PyTorch's tokens are more than {GROSS:g}x beyond the "
            "accuracy policy"
            + ("" if worst is None else f" (step {worst.step}: {worst.max_abs:.3g})")
            + f": expected {wanted.tolist()}, got {chosen.tolist()}",
            fix="convert with precision='fp32' to confirm, or keep the offending layers in float32 (keep_fp32=[...])",
        )
    with_decoding(module.step, diverged(judged, wanted, chosen, ids.shape[1]) if departed else judged)
