"""The vision graph of a vision-language decoder (:mod:`pipeline.generation.vision_language`): one image's inputs to
its features in the text embedding space [tokens, hidden], the vision tower and the projector as the model's own
``get_image_features`` computes them. It runs once per image of a request. Images are cut apart by
:func:`~pipeline.runtime.generation.image_positions.image_rows` (one leading row each, or the flattened patches an
integer grid divides: Qwen2-VL's ``image_grid_thw``); an integer input the tower decides shapes from in Python is held
at the sample's first image's values, known while tracing (:class:`~pipeline.generation.known_values.KnownValues`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from converters.errors import ExportError, InputError, PipelineError
from converters.registry import ConverterRegistry
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.deepstack import DEEPSTACK_FIELD, levels_of
from pipeline.generation.kept_selections import KeptSelection, by_element, kept_selections
from pipeline.generation.known_values import KnownValues
from pipeline.generation.ops import on_tensorrt
from pipeline.generation.vision_inputs import (
    AUDIO,
    IMAGES,
    Modality,
    features_options,
    image_features_method,
    modality_of,
    takes_video_frames,
)
from pipeline.runtime.generation.image_positions import image_rows
from pipeline.runtime.generation.kept_images import ALL_KEPT, FEATURES, KEPT_ELEMENTS, NONE_KEPT
from pipeline.runtime.generation.vision_feed import deepstack_name
from pipeline.runtime.generation.vision_language import shown_values
from pipeline.runtime.module import ConvertedModule
from pipeline.settings import Settings

logger = logging.getLogger(__name__)

#: What an ExportError says of a size or a value the model decides from its data (pipeline.exporting.errors).
DECIDED_FROM_DATA = ("data-dependent", "computed from the tensors' data", "reads a tensor's values as Python numbers")
#: Convert one part (module, sample, settings, converters) through the stages.
Stages = Callable[[torch.nn.Module, Any, Settings, ConverterRegistry], ConvertedModule]


class ImageFeatures(torch.nn.Module):
    """The vision graph: one image's inputs (``names``, in order) to its features [tokens, hidden], the model's own
    ``get_image_features`` (tower and projector) with the per-image pieces joined as the model joins them. ``fixed``
    inputs are held at one image's values; ``kept`` selections are taken to keep every element
    (:mod:`pipeline.generation.kept_selections`); ``levels``: the deepstack levels (by index) the graph also outputs
    (:mod:`pipeline.generation.deepstack`), each [tokens, hidden] as :func:`deepstack_name` names it; ``options``:
    the sample's fixed inputs (:func:`~pipeline.generation.vision_inputs.fixed_inputs`), passed to the method where it
    takes them."""

    def __init__(
        self,
        model: torch.nn.Module,
        names: tuple[str, ...],
        fixed: dict[str, torch.Tensor] | None = None,
        kept: tuple[KeptSelection, ...] = (),
        by_element: bool = False,
        levels: tuple[int, ...] = (),
        options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.options = dict(options or {})
        self.levels = levels
        self.names = names
        self.fixed = dict(fixed or {})  # inputs held at one image's values (constants of the graph)
        self.kept = kept
        #: the features are the lone kept mask's elements' blocks (:func:`kept_selections.by_element`)
        self.by_element = by_element and len(kept) == 1
        #: graph input names of the ``*inputs`` arguments (the exporter reads this mapping)
        self.onnx_input_names = {f"inputs_{i}": name for i, name in enumerate(names)}
        if len(names) == 1:  # the exporter names a lone variadic argument after the parameter
            self.onnx_input_names["inputs"] = names[0]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """The image's features in the text embedding space; with ``kept`` selections, a dict of them
        (:data:`~pipeline.runtime.generation.kept_images.FEATURES`) and whether the masks the model computed kept
        every element and none (:data:`~pipeline.runtime.generation.kept_images.ALL_KEPT`,
        :data:`~pipeline.runtime.generation.kept_images.NONE_KEPT`); ``by_element``, the model's mask too
        (:data:`~pipeline.runtime.generation.kept_images.KEPT_ELEMENTS`); with ``levels``, a dict of the features and
        the levels."""
        # known while tracing: a tensor constant is still data to torch.export, which cannot decide shapes from it
        with KnownValues(self.kept) as known:
            fixed = {name: known.tensor(value) for name, value in self.fixed.items()}
            given = {**dict(zip(self.names, inputs, strict=True)), **fixed}
            features, levels = image_output(self.model, given, self.options)
        stacked = {deepstack_name(level): (levels or [])[level] for level in self.levels}
        if not self.kept:
            return {FEATURES: features, **stacked} if stacked else features
        outputs = {FEATURES: features, **stacked, **kept_elements(known.masks)}
        if self.by_element:
            outputs[KEPT_ELEMENTS] = torch.cat([mask.reshape(-1) for mask in known.masks])
        return outputs


def kept_elements(masks: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whether every one of ``masks`` keeps every element (:data:`ALL_KEPT`) and whether every one keeps none
    (:data:`NONE_KEPT`): boolean scalars (both true without masks), from the masks' least and greatest element."""
    if not masks:
        return {ALL_KEPT: torch.tensor(True), NONE_KEPT: torch.tensor(True)}
    flat = [mask.reshape(-1).to(torch.int32) for mask in masks]
    least = torch.stack([mask.min() for mask in flat]).min()
    greatest = torch.stack([mask.max() for mask in flat]).max()
    return {ALL_KEPT: least > 0, NONE_KEPT: greatest == 0}


def image_features(
    model: torch.nn.Module, inputs: dict[str, Any], options: dict[str, Any] | None = None
) -> torch.Tensor:
    """``model.get_image_features(**inputs)`` as one tensor [tokens, hidden] (what the model scatters over its image
    tokens: the pieces of a list joined in order, a tensor's leading axes flattened)."""
    return image_output(model, inputs, options)[0]


def image_output(
    model: torch.nn.Module, inputs: dict[str, Any], options: dict[str, Any] | None = None
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """:func:`image_features` and the deepstack levels the model also gives, each [tokens, hidden], or None
    (:func:`~pipeline.generation.deepstack.levels_of`). A model that gives levels only has zeros for features.
    ``options``: the sample's fixed inputs, those the method takes passed to it
    (:func:`~pipeline.generation.vision_inputs.features_options`)."""
    modality = modality_of(inputs)
    taken = features_options(model, modality, options or {})
    out = image_features_method(model, modality)(**inputs, **taken, return_dict=True)
    levels = levels_of(out)
    if levels and gives_levels_only(out):  # the model zeroes its image tokens' embeddings (Granite 4 Vision)
        return torch.zeros_like(levels[0]), levels
    return _features_of_output(model, out), levels


def gives_levels_only(out: Any) -> bool:
    """Whether ``get_image_features``' output ``out`` holds no features to place in the embeddings (only deepstack
    levels, Granite 4 Vision's: the model zeroes its image tokens' embeddings and adds a level there)."""
    return getattr(out, "pooler_output", None) is None and getattr(out, "last_hidden_state", None) is None


def _features_of_output(model: torch.nn.Module, out: Any) -> torch.Tensor:
    """The features [tokens, hidden] in ``get_image_features``' output ``out`` (see :func:`image_features`)."""
    pooled = placed_output(out)
    if isinstance(pooled, list | tuple):
        pooled = torch.cat([piece.reshape(-1, piece.shape[-1]) for piece in pooled], dim=0)
    if not isinstance(pooled, torch.Tensor):
        check_placed(model, out)  # features given by decoder layer only (Granite 4 Vision's): said as such
        raise InputError(
            f"{type(model).__name__}.get_image_features returned {type(pooled).__name__}, not the image features",
            fix="generation= converts image-text-to-text models whose get_image_features returns the features",
        )
    return pooled.reshape(-1, pooled.shape[-1])


def convert_vision(
    model: torch.nn.Module,
    vision: dict[str, torch.Tensor],
    settings: Settings,
    registry: ConverterRegistry,
    stages: Stages,
    levels: tuple[int, ...] = (),
    options: dict[str, Any] | None = None,
) -> tuple[ConvertedModule, dict[str, torch.Tensor]]:
    """The vision graph (also giving the deepstack ``levels``: :class:`ImageFeatures`), and the integer inputs it
    holds at the sample's first image's values (none unless needed). A
    tower whose code decides shapes in Python from an integer input (LLaVA-NeXT's and Pixtral's ``image_sizes``)
    cannot export it as data: the graph is converted again with those inputs fixed, and takes images of that size.
    So is a graph for TensorRT that selects features by a mask (``NonZero``, which TensorRT's parser refuses): where
    the mask is computed from the integer inputs (LFM2-VL drops its padding token slots by the image's
    ``spatial_shapes``), it is a constant of the graph with them fixed, and TensorRT takes those inputs' values from
    the sample anyway (shape tensors). Where the mask is the data's and keeps every element of the sample's image
    (Idefics3 drops all-zero padding images by their pixels), the graph for TensorRT takes it as keeping every element
    (:func:`_keeping_every_element`); without integer inputs, that graph is tried first. ``options``: the sample's fixed
    inputs (:func:`~pipeline.generation.vision_inputs.fixed_inputs`), constants of the graph."""
    image = image_rows(vision)[0]
    fixed = {name: value for name, value in image.items() if not value.is_floating_point()}
    kept: tuple[KeptSelection, ...] = ()
    if on_tensorrt(settings):
        with torch.no_grad():
            kept = kept_selections(lambda: image_features(model, image, options))
    if kept and not fixed:
        graph = _keeping_every_element(model, image, {}, kept, settings, registry, stages, levels, options)
        if graph is not None:
            return graph, {}
        kept = ()  # tried: the graph as it is
    why = "decides shapes from"
    try:
        part = ImageFeatures(model, tuple(vision), levels=levels, options=options).train(model.training)
        converted = stages(part, tuple(image.values()), settings, registry)
        if not on_tensorrt(settings) or not _selects_by_mask(converted):
            return converted, {}
        why = "selects its features by a mask computed from"
    except ExportError as error:
        # a size decided from the data (Qwen2.5-Omni selects its audio's frames by its mask, Qwen3-ASR reads its
        # chunks' lengths as numbers): the integer inputs held at the sample's values
        if not fixed or not any(said in str(error) for said in DECIDED_FROM_DATA):
            raise
        converted = None
    if fixed:
        names = tuple(name for name in image if name not in fixed)
        part = ImageFeatures(model, names, fixed, levels=levels, options=options).train(model.training)
        held = stages(part, tuple(image[name] for name in names), settings, registry)
        if not on_tensorrt(settings) or not _selects_by_mask(held):
            _say_held(model, why, fixed, modality_of(image).name)
            return held, fixed
    # the mask is the data's: the graph as it was, unless every selection by it keeps every element
    taken = {} if converted is not None else fixed
    graph = (
        _keeping_every_element(model, image, taken, kept, settings, registry, stages, levels, options) if kept else None
    )
    if graph is None:
        logger.warning(
            "%s's vision graph selects by a mask computed from its data (NonZero), which TensorRT's parser refuses: "
            "it runs segmented (a mask that keeps every element of the sample's first image would be taken so: a "
            "sample whose first image has no padding)",
            type(model).__name__,
        )
    if graph is None and converted is not None:
        return converted, {}
    if taken:
        _say_held(model, "decides shapes from", taken, modality_of(image).name)
    return (held if graph is None else graph), taken


def _say_held(model: torch.nn.Module, why: str, fixed: dict[str, torch.Tensor], modality: str) -> None:
    """Log the inputs the features graph of ``modality`` holds at the sample's values, and why."""
    audio = modality == AUDIO.name
    tower, size = ("audio", "audio of that length") if audio else ("vision", "images processed to that size")
    logger.warning(
        "%s's %s tower %s %s in Python: its features graph holds them at the sample's values %s (it takes %s)",
        type(model).__name__,
        tower,
        why,
        ", ".join(fixed),
        {name: shown_values(value) for name, value in fixed.items()},
        size,
    )


def _keeping_every_element(
    model: torch.nn.Module,
    image: dict[str, torch.Tensor],
    fixed: dict[str, torch.Tensor],
    kept: tuple[KeptSelection, ...],
    settings: Settings,
    registry: ConverterRegistry,
    stages: Stages,
    levels: tuple[int, ...] = (),
    options: dict[str, Any] | None = None,
) -> ConvertedModule | None:
    """The vision graph with the ``kept`` selections (:func:`~pipeline.generation.kept_selections.kept_selections` on
    the sample's image) taken as keeping every element, or None when it does not convert or still selects. The graph
    also says whether the model's masks kept every element and whether they kept none (:func:`kept_elements`): the
    runtime drops an image they keep none of (a padding image) and refuses one they keep in part
    (:func:`~pipeline.runtime.generation.kept_images.kept_features`), unless the features are the lone mask's
    elements' blocks (:func:`~pipeline.generation.kept_selections.by_element`: Idefics3's, one block per image of a
    row): the graph then also outputs the model's mask, and the runtime keeps the blocks of the elements it keeps."""
    names = tuple(name for name in image if name not in fixed)
    with torch.no_grad():  # the sample's mask keeps every element: the model's features are the whole's
        elements = len(kept) == 1 and by_element(
            lambda: image_features(model, image, options), kept[0], image_features(model, image, options)
        )
    part = ImageFeatures(model, names, fixed, kept, elements, levels, options).train(model.training)
    try:
        graph = stages(part, tuple(image[name] for name in names), settings, registry)
    except PipelineError as error:  # the graph as it was (segmented), with the reason
        logger.warning("the vision graph keeping every selected element does not convert (%s): it selects", error)
        return None
    if _selects_by_mask(graph):
        return None
    logger.warning(
        "%s's vision tower selects by masks computed from its data (%s); each keeps every element of the sample's "
        "image, and the vision graph for TensorRT takes it so (no NonZero): an image whose mask drops every element "
        "(a padding image) gives no features, and one whose mask drops some gives its kept elements' features where "
        "they are the mask's elements' blocks (%s), else is refused",
        type(model).__name__,
        ", ".join(f"{name} #{count}" for name, count in (selection.maker for selection in kept)),
        "they are" if part.by_element else "they are not",
    )
    return graph


def _selects_by_mask(module: ConvertedModule) -> bool:
    """Whether the converted graph selects elements by a mask (``NonZero``)."""
    return any(node.op_type == "NonZero" for node in module.onnx.graph.node)


def image_token_id(model: torch.nn.Module, modality: Modality = IMAGES) -> int | None:
    """The token the model places image features at (its config's ``image_token_id``, or ``image_token_index``; its
    ``video_token_id`` or ``video_token_index`` where its images are a video's frames: InstructBLIP-Video's; its
    ``audio_token_id`` or ``audio_token_index`` for audio features)."""
    config = getattr(model, "config", None)
    kind = "video" if takes_video_frames(model, modality) else modality.name
    for name in (f"{kind}_token_id", f"{kind}_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def token_embedding(model: torch.nn.Module, token: int | None, hidden: int) -> torch.Tensor:
    """A decode step's features [hidden] (zeros without an image token): what the model's input embedding gives at its
    image token when the model runs on that token alone, with no image
    (:func:`~pipeline.generation.placeholders.embedded_at`: Gemma 4 embeds its pad token there); where the model
    refuses the token alone, the embedding of the token itself."""
    from pipeline.generation.placeholders import embedded_at

    embeddings = getattr(model, "get_input_embeddings", None)
    if token is None or not callable(embeddings):
        return torch.zeros(hidden)
    row = embedded_at(model, token)
    if row is None or row.numel() != hidden:
        with torch.no_grad():
            row = embeddings()(torch.tensor([token], dtype=torch.int64)).reshape(-1).float()
    return row if row.numel() == hidden else torch.zeros(hidden)


def pooled_features(
    model: torch.nn.Module, image: dict[str, torch.Tensor], options: dict[str, Any] | None = None
) -> Any:
    """The features ``get_image_features`` gives one image (its ``pooler_output``); an InputError when it also gives
    features the model adds elsewhere than at the image tokens' embeddings, other than deepstack levels
    (:func:`~pipeline.generation.deepstack.levels_of`)."""
    with torch.no_grad():
        modality = modality_of(image)
        taken = features_options(model, modality, options or {})
        out = image_features_method(model, modality)(**image, **taken, return_dict=True)
    check_placed(model, out)
    return placed_output(out)


def placed_output(out: Any) -> Any:
    """What the model places at its image tokens of ``get_image_features``' output ``out``: its ``pooler_output``,
    else, when that is None, its ``last_hidden_state`` (Fuyu's patch embeddings, which it gives unpooled)."""
    pooled = getattr(out, "pooler_output", out)
    return getattr(out, "last_hidden_state", None) if pooled is None else pooled


def check_placed(model: torch.nn.Module, out: Any) -> None:
    """An InputError when ``get_image_features``' output ``out`` holds features the model adds elsewhere than at the
    image tokens' embeddings, other than a list of deepstack levels (:func:`~pipeline.generation.deepstack.levels_of`:
    Qwen3-VL's and Granite 4 Vision's, which the step adds where the model adds them)."""
    keys = getattr(out, "keys", None)
    for field in keys() if callable(keys) else ():
        value = out[field]
        placed = field in _PLACED_OUTPUTS or field.endswith(_TOWER_OUTPUTS)
        if field == DEEPSTACK_FIELD and levels_of(out) is not None:
            continue  # levels the step adds after the decoder layers the model adds them at (deepstack_layers)
        # token ids (Emu3's VQ codes per image, which its features embed) are not features added elsewhere
        ids = isinstance(value, list | tuple) and all(
            isinstance(v, torch.Tensor) and not v.is_floating_point() for v in value
        )
        if not placed and isinstance(value, list | tuple) and value and not ids:
            raise InputError(
                f"{type(model).__name__}.get_image_features also returns {field} ({len(value)}), which the model adds "
                "inside its decoder layers at the image tokens, not as a list of levels of features [image tokens, "
                "hidden] (the deepstack levels the cached step adds after its decoder layers)"
                + (", and no features to place in the embeddings" if gives_levels_only(out) else ""),
                fix=f"{PLAIN_FORWARD}, or a model whose images enter at the embeddings",
            )


#: Fields of ``get_image_features``' output the step accounts for: the features it places and the tower's own states.
_PLACED_OUTPUTS = ("pooler_output", "last_hidden_state", "hidden_states", "attentions")
#: Endings of a second vision tower's own states (DeepSeek-VL-Hybrid's ``high_res_vision_hidden_states``); any other
#: list, a ``deepstack_hidden_states`` say, is features the model adds elsewhere and is refused.
_TOWER_OUTPUTS = ("_vision_hidden_states", "_vision_attentions", "_vision_last_hidden_state")


def features_of(
    model: torch.nn.Module, vision: dict[str, torch.Tensor], options: dict[str, Any] | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Every image's features, one image at a time (as the vision graph runs), joined in order [tokens, hidden], and
    every image's deepstack levels joined so (none when the model gives none); ``options``: the sample's fixed
    inputs."""
    try:
        outputs = [image_output(model, image, options) for image in image_rows(vision)]
        features = torch.cat([features for features, _ in outputs], dim=0)
        stacks = [levels for _, levels in outputs if levels is not None]
        if len(stacks) != len(outputs):
            return features, []
        return features, [torch.cat(pieces, dim=0) for pieces in zip(*stacks, strict=True)]
    except InputError:
        raise
    except Exception as error:  # noqa: BLE001 - the model refusing one image at a time: said with its cause
        raise InputError(
            f"{type(model).__name__}.{modality_of(vision).method} fails on one {modality_of(vision).name} of the "
            f"sample: {type(error).__name__}: {' '.join(str(error).split())[:300]}",
            fix=f"pass the processor's {modality_of(vision).name} inputs (one leading row per item)",
        ) from error
