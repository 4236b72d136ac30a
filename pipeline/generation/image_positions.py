"""Reading a vision-language model's multi-axis positions (M-RoPE) from the model itself.

The model is run on the conversion sample with a hook on its text decoder, which records the ``position_ids`` the
model hands it. Positions with an axis dimension ([axes, batch, tokens]) are multi-axis: the first image of the sample
gives the block of positions an image takes relative to its start and the extent the text after it moves on by
(:class:`~pipeline.runtime.generation.image_positions.ImagePositions`); then the rule is checked against the model's
own positions on every row of the sample, so a model whose positions follow another rule is refused by name rather
than decoded wrongly. Nothing here reads one architecture's code.
"""

from __future__ import annotations

from typing import Any

import torch

from converters.errors import InputError
from pipeline.runtime.generation.image_positions import ImagePositions


def decoder_positions(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor | None:
    """The ``position_ids`` ``model`` hands its text decoder when run on ``inputs`` (None: it hands none, or has no
    separate decoder)."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    if not isinstance(decoder, torch.nn.Module) or decoder is model:
        return None
    seen: list[Any] = []

    def record(_module: torch.nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(kwargs.get("position_ids"))

    handle = decoder.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    found = seen[0] if seen else None
    return found if isinstance(found, torch.Tensor) else None


def image_positions(model: torch.nn.Module, inputs: dict[str, Any], image_token: int | None) -> ImagePositions | None:
    """The model's image positions read from its own on ``inputs`` (the sample: ``input_ids``, ``attention_mask``
    and the image inputs), or None when its positions have one axis."""
    positions = decoder_positions(model, inputs)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    if positions is None or positions.dim() != 3 or positions.shape[1:] != ids.shape:
        return None
    name = type(model).__name__
    if image_token is None:
        raise InputError(
            f"{name} gives its text decoder positions on {positions.shape[0]} axes, and its config names no image "
            "token to lay them out from",
            fix="convert without generation= (the plain forward)",
        )
    found = _first_image(ids, mask, image_token)
    if found is None:
        raise InputError(
            f"{name} gives its text decoder positions on {positions.shape[0]} axes: the sample needs an image "
            "followed by text in its first row to read how an image's positions are laid out",
            fix="pass a sample whose first prompt has text after its image",
        )
    row, start, stop = found
    kept = mask[row].bool()
    before = positions[0, row, :start][kept[:start]]
    origin = int(before.max()) + 1 if before.numel() else 0
    block = positions[:, row, start:stop] - origin
    after = torch.nonzero(kept[stop:]).flatten()
    extent = int(positions[0, row, stop + int(after[0])]) - origin
    rule = ImagePositions(block.to(torch.int64), extent, image_token)
    try:
        laid = rule.prompt(ids, mask)
    except InputError as error:
        raise InputError(
            f"{name}'s images in the sample do not all take {stop - start} tokens: {error.message}",
            fix="pass a sample whose images are processed to one size",
        ) from None
    real = mask.bool().unsqueeze(0).expand_as(laid)
    if not torch.equal(laid[real], positions.to(torch.int64)[real]):
        raise InputError(
            f"{name}'s positions for the sample's tokens do not follow one layout per image (each image a block of "
            "positions from where it starts, the text after it going on by the block's extent)",
            fix="convert without generation= (the plain forward); report the model",
        )
    return rule


def _first_image(ids: torch.Tensor, mask: torch.Tensor, token: int) -> tuple[int, int, int] | None:
    """(row, start, stop) of the first run of image tokens with a kept text token after it."""
    for row in range(ids.shape[0]):
        is_image = (ids[row] == token) & mask[row].bool()
        columns = torch.nonzero(is_image).flatten().tolist()
        if not columns:
            continue
        start = stop = columns[0]
        while stop < ids.shape[1] and bool(is_image[stop]):
            stop += 1
        if bool(mask[row, stop:].bool().any()):
            return row, start, stop
    return None
