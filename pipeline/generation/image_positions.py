"""Reading a vision-language model's multi-axis positions (M-RoPE) from the model itself.

The model is run on the conversion sample with a hook on its text decoder, which records the ``position_ids`` the
model hands it. Positions with an axis dimension ([axes, batch, tokens]) are multi-axis: the first image of the sample
gives the block of positions an image takes relative to its start and the extent the text after it moves on by
(:class:`~pipeline.runtime.generation.image_positions.ImagePositions`); then the rule is checked against the model's
own positions on every row of the sample, so a model whose positions follow another rule is refused by name rather
than decoded wrongly. Which positions of the block move with the image's start, and which count the request's images
(HunYuan-VL's), is read from the model too: on a probe of two copies of that image's prompt, the second starting
:data:`SHIFT` tokens later, and the second image of the request. A model whose positions follow none of this is read
again with the block opened by 1, then up to :data:`BEFORE`, tokens before each image (MiniCPM-V 4.7's canvas, which
its ``<image>`` marker opens); the first layout that gives every kept token of the sample the model's own positions
is kept. Nothing here reads one architecture's code.
"""

from __future__ import annotations

from typing import Any

import torch

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD
from pipeline.runtime.generation.image_positions import ImagePositions, image_rows


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
            fix=PLAIN_FORWARD,
        )
    if _first_image(ids, mask, image_token, 0) is None:
        raise InputError(
            f"{name} gives its text decoder positions on {positions.shape[0]} axes: the sample needs an image "
            "followed by text in its first row to read how an image's positions are laid out",
            fix="pass a sample whose first prompt has text after its image",
        )
    refusal: InputError | None = None
    for before in range(BEFORE + 1):  # the plain layout first: the image starts at its first image token
        try:
            return _laid_from(model, inputs, positions, image_token, before)
        except _NotThisLayout as error:
            refusal = refusal or error.refusal
    assert refusal is not None
    raise InputError(
        f"{refusal.message} (nor with an image's block opened by 1 to {BEFORE} text tokens before it)",
        fix=refusal.fix,
    )


#: How many tokens before an image's tokens its block may lay out (MiniCPM-V 4.7's: its ``<image>`` marker).
BEFORE = 2


class _NotThisLayout(Exception):
    """The sample's positions do not follow the layout with this many tokens before each image: why (``refusal``)."""

    def __init__(self, refusal: InputError) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def _laid_from(
    model: torch.nn.Module, inputs: dict[str, Any], positions: torch.Tensor, image_token: int, before: int
) -> ImagePositions:
    """The layout whose block opens ``before`` tokens before each image, read from the first image with text on
    both sides (one more token before it than the block's when it has any, so that none of the block's positions
    falls below 0 on the probe) and checked on every row of the sample; :class:`_NotThisLayout` when the model's
    positions follow another."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    name = type(model).__name__
    found = _first_image(ids, mask, image_token, before + 1 if before else 0)
    if found is None:
        where = f"{before + 1} text tokens before it and " if before else ""
        raise _NotThisLayout(
            InputError(
                f"{name} gives its text decoder positions on {positions.shape[0]} axes: the sample needs an image "
                f"with {where}text after it to read how an image's positions are laid out",
                fix="pass a sample whose first prompt has text before and after its image",
            )
        )
    row, start, stop = found
    kept = mask[row].bool()
    origin = _origin(positions[0, row], kept, start - before)
    after = torch.nonzero(kept[stop:]).flatten()
    extent = int(positions[0, row, stop + int(after[0])]) - origin
    try:
        anchored, counted = _anchors(model, inputs, row, start - before, stop, stop + int(after[0]) + 1)
    except InputError as error:
        raise _NotThisLayout(error) from None
    block = positions[:, row, start - before : stop].to(torch.int64) - anchored.to(torch.int64) * origin
    every = bool(anchored.all()) and not bool(counted.any())  # the plain layout: the block moves with its start
    masks = {} if every else {"anchored": anchored, "counted": counted}
    rule = ImagePositions(block, extent, image_token, **masks, before=before)
    try:
        laid = rule.prompt(ids, mask)
    except InputError as error:
        raise InputError(
            f"{name}'s images in the sample do not all take {stop - start} tokens: {error.message}",
            fix="pass a sample whose images are processed to one size",
        ) from None
    real = mask.bool().unsqueeze(0).expand_as(laid)
    if not torch.equal(laid[real], positions.to(torch.int64)[real]):
        parted = _parted(laid, positions, ids, mask, image_token)
        raise _NotThisLayout(
            InputError(
                f"{name}'s positions for the sample's tokens do not follow one layout per image (each image a block "
                f"of positions from where it starts, the text after it going on by the block's extent): {parted}",
                fix=f"{PLAIN_FORWARD}; report the model",
            )
        )
    return rule


def _parted(laid: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, token: int) -> str:
    """Where the model's own ``positions`` part from the rule's (``laid``), said by kind of token: image tokens, or
    text tokens next to an image (positions the image's grid gives the markers around it) or apart from one."""
    differ = ((laid != positions.to(torch.int64)).any(0) & mask.bool()).nonzero().tolist()
    image = ids == token
    beside = torch.zeros_like(image)
    beside[:, 1:] |= image[:, :-1]
    beside[:, :-1] |= image[:, 1:]
    kinds = ["image tokens" if image[r, c] else "text next to an image" if beside[r, c] else "text" for r, c in differ]
    counted = ", ".join(f"{kinds.count(kind)} {kind}" for kind in dict.fromkeys(kinds))
    return f"they part at {counted} (row, column: {differ[:6]})"


#: How many text tokens the probe's second prompt has more before its image (see :func:`_anchors`).
SHIFT = 2


def _origin(positions: torch.Tensor, kept: torch.Tensor, start: int) -> int:
    """Where an image at column ``start`` starts: one past the largest position of the kept tokens before it."""
    before = positions[:start][kept[:start]]
    return int(before.max()) + 1 if before.numel() else 0


def _anchors(
    model: torch.nn.Module, inputs: dict[str, Any], row: int, start: int, stop: int, end: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which positions of the image block ``start:stop`` of ``row`` move with the image's start (``anchored``) and which
    count the request's images (``counted``), both [axes, image tokens], read from the model's own positions on a
    probe: ``row`` up to ``end`` (its first image and the text token after it) twice, the first copy left-padded by
    :data:`SHIFT` tokens and the second starting with :data:`SHIFT` more text tokens (the one after the image), each
    with the sample's first image. A position the second image takes ``SHIFT`` past the first's moves with its
    start, one past it counts the images, both: ``SHIFT + 1``; anything else is refused."""
    ids = inputs["input_ids"]
    text_column = end - 1  # the text token after the image: the second copy's extra tokens repeat it
    probe: dict[str, Any] = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.shape == ids.shape:  # one per token: ids, mask, token types
            piece = value[row : row + 1, :end]
            extra = piece[:, text_column : text_column + 1].expand(1, SHIFT)
            padded = torch.zeros_like(extra) if name in ("input_ids", "attention_mask") else extra
            probe[name] = torch.cat([torch.cat([padded, piece], 1), torch.cat([extra, piece], 1)])
    probe["attention_mask"][1, :SHIFT] = 1
    first = image_rows({k: v for k, v in inputs.items() if k not in probe and isinstance(v, torch.Tensor)})[0]
    positions, failed = None, ""
    for twice in _twice(first):  # the first image twice, in the first layout the model takes
        try:
            positions = decoder_positions(model, {**probe, **twice})
            break
        except Exception as error:  # noqa: BLE001 - the model refuses this layout of two images: the next one
            failed = f" (it fails on them: {type(error).__name__}: {str(error)[:200]})"
    name = type(model).__name__
    if positions is None or positions.dim() != 3 or positions.shape[1:] != probe["input_ids"].shape:
        raise InputError(
            f"{name} gave no positions on several axes for two copies of the sample's first prompt with an image"
            + failed,
            fix=f"{PLAIN_FORWARD}; report the model",
        )
    kept = probe["attention_mask"].bool()
    image = slice(start + SHIFT, stop + SHIFT)
    shift = _origin(positions[0, 1], kept[1], start + SHIFT) - _origin(positions[0, 0], kept[0], start + SHIFT)
    moved = positions[:, 1, image] - positions[:, 0, image]
    if shift != SHIFT or not bool(((moved == 0) | (moved == 1) | (moved == shift) | (moved == shift + 1)).all()):
        raise InputError(
            f"{name}'s positions for an image do not move with where it starts, or with how many images came before "
            f"it, by a rule the step knows (moved {sorted(set(moved.flatten().tolist()))} for an image {SHIFT} text "
            "tokens later and one image later)",
            fix=f"{PLAIN_FORWARD}; report the model",
        )
    anchored = moved >= shift
    return anchored, (moved - anchored.to(moved.dtype) * shift) == 1


def _twice(image: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """An image's inputs (as :func:`image_rows` cut them) twice, as a request of two images lays them out: stacked on
    their leading axis (rows, or flattened patches with their grid), else with its floating inputs of one leading row
    joined along their last axis (packed in one row: MiniCPM-V's ``pixel_values``) and the others stacked."""
    rows = {name: torch.cat([value, value]) for name, value in image.items()}
    packed = {
        name: torch.cat([value, value], -1 if value.is_floating_point() and value.dim() > 1 and len(value) == 1 else 0)
        for name, value in image.items()
    }
    return [rows, packed]


def _first_image(ids: torch.Tensor, mask: torch.Tensor, token: int, before: int) -> tuple[int, int, int] | None:
    """(row, start, stop) of the first run of image tokens, the first of its row, with a kept text token after it and
    ``before`` kept text tokens before it. The block is read from those columns on: its first token's column is
    ``start - before``, for which the kept tokens must stand right before the image (left padding only)."""
    for row in range(ids.shape[0]):
        is_image = (ids[row] == token) & mask[row].bool()
        columns = torch.nonzero(is_image).flatten().tolist()
        if not columns:
            continue
        start = stop = columns[0]
        if before and not bool(mask[row, max(start - before, 0) : start].bool().all() and start >= before):
            continue
        while stop < ids.shape[1] and bool(is_image[stop]):
            stop += 1
        if bool(mask[row, stop:].bool().any()):
            return row, start, stop
    return None
