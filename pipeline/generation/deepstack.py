"""Deepstack features of a vision-language decoder (Qwen3-VL, Qwen3-VL-MoE, Cosmos 3 omni): besides the features it
places in the embeddings, the model's ``get_image_features`` gives more levels of features [image tokens, hidden],
which its text model adds to the hidden states at the image tokens between its decoder layers, in the prefill only.

Nothing here reads one architecture's code. Which level enters after which decoder layer is read from the model: the
sample's forward is run once with hooks on the text model's decoder layers and on the modules it calls after them
(:func:`deepstack_layers`), and wherever the hidden states a layer returns differ from those the next call takes, the
difference must be zero at every text token and, at the image tokens in order, one level's features
(:class:`DeepstackLevels`). A model whose ``get_image_features`` gives no features to place in the embeddings, only
levels (Granite 4 Vision's), zeroes its image tokens' embeddings: the step places zeros there, and the level its first
decoder layer takes at the image tokens is added before that layer. The step adds the levels with hooks
(:func:`added_after_layers`), at the image tokens placed by the same gather that places the image features in the
embeddings (no ``NonZero``: the model's own ``hidden[mask] += features`` exports to it, and TensorRT's parser refuses
it). A difference that no level explains is refused by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD
from pipeline.runtime.generation.image_positions import gathered_rows

#: The key of :attr:`DeepstackLevels.after` for levels added before the first decoder layer.
BEFORE_LAYERS = -1
#: How close the model's own addition must be to a level (relative to the level's largest magnitude).
_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class DeepstackLevels:
    """Which levels of deepstack features (by index in the model's list) the text model adds after which of its
    decoder layers (by index; :data:`BEFORE_LAYERS`: before the first, into its image tokens' zeroed embeddings):
    ``after[layer]`` the levels, in order. Levels added nowhere are left out of both graphs
    (Qwen3-VL has as many levels as its tower's ``deepstack_visual_indexes``; a text model of fewer layers adds the
    first ones only)."""

    after: dict[int, tuple[int, ...]]

    @property
    def levels(self) -> tuple[int, ...]:
        """The levels added somewhere, in the order the step takes them."""
        return tuple(sorted(level for levels in self.after.values() for level in levels))


def levels_of(out: Any) -> list[torch.Tensor] | None:
    """The deepstack levels in ``get_image_features``' output ``out`` for one image, each [image tokens, hidden] (the
    per-image pieces of a level joined in order), or None when it gives none: a field of the output holding a list of
    levels, each a tensor or a list of per-image tensors (Qwen3-VL's ``deepstack_features``), or pairs of a decoder
    layer and such a level (Granite 4 Vision's: the layer is not read, the model's forward shows where it adds the
    level)."""
    value = _levels_field(out)
    if value is None:
        return None
    levels = []
    for level in value:
        if isinstance(level, tuple) and len(level) == 2 and isinstance(level[0], int):
            # a pair of a decoder layer and the level (Granite 4 Vision's): where it goes is read from the model
            level = level[1]
        pieces = [level] if isinstance(level, torch.Tensor) else list(level)
        if not pieces or not all(isinstance(piece, torch.Tensor) for piece in pieces):
            return None
        levels.append(torch.cat([piece.reshape(-1, piece.shape[-1]) for piece in pieces], dim=0))
    return levels


def _levels_field(out: Any) -> Any:
    """The value of ``out``'s field named ``deepstack_features`` when it is a non-empty list."""
    keys = getattr(out, "keys", None)
    if not callable(keys) or DEEPSTACK_FIELD not in keys():
        return None
    value = out[DEEPSTACK_FIELD]
    return value if isinstance(value, list | tuple) and value else None


#: The field of ``get_image_features``' output whose levels the model adds inside its decoder layers.
DEEPSTACK_FIELD = "deepstack_features"


def decoder_layers(text_model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The text model's decoder layers: its ``layers`` (a ModuleList), or None."""
    layers = getattr(text_model, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) and len(layers) else None


def deepstack_layers(
    model: torch.nn.Module,
    text_model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    is_image: torch.Tensor,
    levels: list[torch.Tensor],
    zeroed: bool = False,
) -> DeepstackLevels:
    """After which decoder layers of ``text_model`` the model adds which of its deepstack ``levels`` (every image's,
    joined in order) on the sample ``inputs`` (the prompt and the images; ``is_image`` [B, S] marks the image tokens),
    read from the model's own forward (see the module docstring); an InputError naming the model when an addition is
    not one level at the image tokens. ``zeroed``: the model gives no features to place in the embeddings (Granite 4
    Vision's), and its first layer must take one level alone at the image tokens (added before the layers, into
    embeddings it zeroes there)."""
    name = type(model).__name__
    layers = decoder_layers(text_model)
    if layers is None:
        raise InputError(
            f"{name}'s text model ({type(text_model).__name__}) has no list of decoder layers (`layers`) to add its "
            "deepstack features after",
            fix=PLAIN_FORWARD,
        )
    calls = _hidden_calls(model, text_model, layers, inputs)
    after: dict[int, tuple[int, ...]] = {}
    for (index, returned), (_, taken) in zip(calls, calls[1:], strict=False):
        if index is None or returned.shape != taken.shape:
            continue
        added = (taken - returned).float()
        if float(added.abs().max()) == 0.0:
            continue
        level = _which_level(added, is_image, levels)
        if level is None:
            raise InputError(
                f"{name}'s text model changes the hidden states after its decoder layer {index} otherwise than by "
                "adding one level of its deepstack features at the image tokens (the step adds each level after the "
                "layer the model adds it at, and nothing else)",
                fix=PLAIN_FORWARD,
            )
        after[index] = (*after.get(index, ()), level)
    if zeroed and calls and calls[0][0] is None:  # the first layer's input at the image tokens: a level alone
        before = _which_level(calls[0][1].masked_fill(~is_image.unsqueeze(-1), 0.0).float(), is_image, levels)
        if before is None:
            raise InputError(
                f"{name} places no image features in its embeddings, and its first decoder layer does not take one "
                "level of its deepstack features at the image tokens (the step gives them zeroed embeddings there, "
                "and adds each level where the model adds it)",
                fix=PLAIN_FORWARD,
            )
        after = {BEFORE_LAYERS: (before,), **after}
    return DeepstackLevels(after)


def _hidden_calls(
    model: torch.nn.Module, text_model: torch.nn.Module, layers: torch.nn.ModuleList, inputs: dict[str, torch.Tensor]
) -> list[tuple[int | None, torch.Tensor]]:
    """The model's forward on ``inputs``, recorded: for each decoder layer in call order, the hidden states it takes
    (``(None, states)``) and those it returns (``(index, states)``), and the hidden states each other module of the
    text model called after a layer takes (its final norm's: what the last layer's output became)."""
    calls: list[tuple[int | None, torch.Tensor]] = []
    indices = {id(layer): index for index, layer in enumerate(layers)}

    def taken(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        states = args[0] if args else kwargs.get("hidden_states")
        if isinstance(states, torch.Tensor) and (id(module) in indices or calls):
            calls.append((None, states.detach().clone()))

    def returned(module: torch.nn.Module, _args: Any, _kwargs: dict[str, Any], out: Any) -> None:
        states = out[0] if isinstance(out, list | tuple) else out
        if isinstance(states, torch.Tensor):
            calls.append((indices[id(module)], states.detach().clone()))

    others = [child for child in text_model.children() if child is not layers]
    handles = [module.register_forward_pre_hook(taken, with_kwargs=True) for module in (*layers, *others)]
    handles += [layer.register_forward_hook(returned, with_kwargs=True) for layer in layers]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def _which_level(added: torch.Tensor, is_image: torch.Tensor, levels: list[torch.Tensor]) -> int | None:
    """The level ``added`` [B, S, hidden] is (zero at the text tokens, the level's rows at the image tokens in order),
    or None."""
    if added.shape[:-1] != is_image.shape:
        return None
    scale = max(float(level.abs().max()) for level in levels) or 1.0
    if float(added.masked_fill(is_image.unsqueeze(-1), 0.0).abs().max()) > _TOLERANCE * scale:
        return None
    at_images = added[is_image]
    for index, level in enumerate(levels):
        if level.shape == at_images.shape and float((at_images - level.float()).abs().max()) <= _TOLERANCE * scale:
            return index
    return None


def placed_levels(hidden: torch.Tensor, is_image: torch.Tensor, levels: list[torch.Tensor]) -> torch.Tensor:
    """``hidden`` [B, S, hidden] with the sum of ``levels`` added at the image tokens, the n-th image token (row
    after row) taking each level's n-th row (the gather of
    :func:`~pipeline.generation.vision_step.placed_features`: no ``NonZero``)."""
    total = levels[0]
    for level in levels[1:]:
        total = total + level
    return torch.where(is_image.unsqueeze(-1), hidden + gathered_rows(total, is_image, hidden), hidden)


@contextlib.contextmanager
def added_after_layers(
    text_model: torch.nn.Module, deepstack: DeepstackLevels, is_image: torch.Tensor, levels: list[torch.Tensor]
) -> Iterator[None]:
    """Within the block, each decoder layer of ``text_model`` that ``deepstack`` names returns its hidden states with
    its levels (``levels``: one tensor per level of :attr:`DeepstackLevels.levels`, in that order) added at the image
    tokens (:func:`placed_levels`); the first layer takes those of :data:`BEFORE_LAYERS` added to its input."""
    layers = decoder_layers(text_model)
    assert layers is not None  # deepstack_layers found them
    position = {level: i for i, level in enumerate(deepstack.levels)}

    def hook(index: int) -> Any:
        def add(_module: torch.nn.Module, _args: Any, out: Any) -> Any:
            mine = [levels[position[level]] for level in deepstack.after[index]]
            if isinstance(out, torch.Tensor):
                return placed_levels(out, is_image, mine)
            return (placed_levels(out[0], is_image, mine), *out[1:])

        return add

    def before(_module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        mine = [levels[position[level]] for level in deepstack.after[BEFORE_LAYERS]]
        if args:
            return (placed_levels(args[0], is_image, mine), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": placed_levels(kwargs["hidden_states"], is_image, mine)}

    handles = [layers[index].register_forward_hook(hook(index)) for index in deepstack.after if index >= 0]
    if BEFORE_LAYERS in deepstack.after:
        handles.append(layers[0].register_forward_pre_hook(before, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
