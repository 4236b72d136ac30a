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

from converters.errors import ExportError, InputError
from converters.registry import ConverterRegistry
from pipeline.generation.known_values import KnownValues
from pipeline.generation.ops import on_tensorrt
from pipeline.generation.vision_inputs import image_features_method
from pipeline.runtime.generation.image_positions import image_rows
from pipeline.runtime.module import ConvertedModule
from pipeline.settings import Settings

logger = logging.getLogger(__name__)

#: Convert one part (module, sample, settings, converters) through the stages.
Stages = Callable[[torch.nn.Module, Any, Settings, ConverterRegistry], ConvertedModule]


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


def convert_vision(
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


def token_embedding(model: torch.nn.Module, token: int | None, hidden: int) -> torch.Tensor:
    """The model's text embedding of its image token [hidden] (zeros without one): a decode step's features."""
    embeddings = getattr(model, "get_input_embeddings", None)
    if token is None or not callable(embeddings):
        return torch.zeros(hidden)
    with torch.no_grad():
        row = embeddings()(torch.tensor([token], dtype=torch.int64))
    return row.reshape(-1).float() if row.numel() == hidden else torch.zeros(hidden)


def pooled_features(model: torch.nn.Module, image: dict[str, torch.Tensor]) -> Any:
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


def features_of(model: torch.nn.Module, vision: dict[str, torch.Tensor]) -> torch.Tensor:
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
