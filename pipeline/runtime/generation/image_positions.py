"""Positions on several axes for a prompt with images (multimodal rotary positions, M-RoPE: Qwen2-VL and the models
built on it), and how a request's images are cut into one vision-graph run each.

A model of this kind gives every token a position per axis ([axes, batch, tokens]: time, rows, columns). A text
token's position is the same on every axis and one more than the token before it; an image's tokens take a block of
positions laid out over its patch grid, offset by where the image starts, and the text after the image goes on from
that start plus the image's extent (not its token count). The block and the extent depend only on the image's grid,
which the vision graph holds fixed: they are read from the model's own positions on the conversion sample
(:mod:`pipeline.generation.image_positions`) and stored here. After the prompt every new token is text: one more than
the row's largest position so far, on every axis (what the model's ``generate`` computes from its ``rope_deltas``).

Not every position of a block moves with the image's start: HunYuan-VL gives an image's grid tokens their column and
row within the image as they are (``anchored`` False there: the same wherever the image starts), and on another axis
the image's number among the request's images, counted over its prompts in order (``counted``), while the tokens
that open and close the image go on from the text before it. Each position of the block is its value plus the
image's start where it is anchored, plus the image's number where it is counted.

Nor does every image start at its first image token: MiniCPM-V 4.7 lays an image on a canvas that the token before it
(its ``<image>`` marker) opens, at the position that token would take as text on the time axis and one row and column
outside the canvas on the others (never below 0), the image's tokens from that same position. The block then covers
``before`` tokens before the image's tokens, and the image starts where the first of them would as text; an image
with fewer kept text tokens before it (at the start of a prompt, or right after another image) lays only the last
of the block's leading positions it has, from where the first of them would start.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch

from converters.errors import InputError


@dataclasses.dataclass(frozen=True)
class ImagePositions:
    """An image's positions relative to its start (``block`` [axes, before + image tokens]) and how far the next
    token's position is past that start (``extent``), for the model's image token. ``anchored`` [axes, block tokens]
    (bool; None: all) says which positions of the block move with the image's start, ``counted`` (None: none) which
    ones add the image's number among the request's images; ``before`` how many tokens before the image's tokens the
    block lays out (see the module docstring)."""

    block: torch.Tensor
    extent: int
    image_token: int
    anchored: torch.Tensor | None = None
    counted: torch.Tensor | None = None
    before: int = 0

    @property
    def axes(self) -> int:
        """The number of position axes (3: time, rows, columns)."""
        return int(self.block.shape[0])

    def laid(self, start: int, number: int) -> torch.Tensor:
        """The positions [axes, before + image tokens] of an image that starts at ``start``, the ``number``-th (from
        0) of the request (never below 0: a marker's row and column outside a canvas at the prompt's start)."""
        shift = start if self.anchored is None else self.anchored.to(torch.int64) * start
        count = 0 if self.counted is None else self.counted.to(torch.int64) * number
        return (self.block + shift + count).clamp(min=0)

    def prompt(self, ids: torch.Tensor, mask: torch.Tensor, item: str = "image") -> torch.Tensor:
        """The prompts' positions [axes, rows, tokens] (padding at 1, as the single-axis step's); ``item`` names what
        the placeholder tokens stand for in the errors (``"image"``, ``"audio"``: the module's modality)."""
        rows, length = ids.shape
        tokens = int(self.block.shape[1]) - self.before
        positions = torch.ones(self.axes, rows, length, dtype=torch.int64)
        number = 0
        for row in range(rows):
            kept = torch.nonzero(mask[row]).flatten().tolist()
            current, index, text = 0, 0, 0  # text: kept text tokens since the row's start or the last image
            while index < len(kept):
                column = kept[index]
                if int(ids[row, column]) != self.image_token:
                    positions[:, row, column] = current
                    current, index, text = current + 1, index + 1, text + 1
                    continue
                run = kept[index : index + tokens]
                if len(run) < tokens or any(int(ids[row, c]) != self.image_token for c in run):
                    items = plural(item)
                    raise InputError(
                        f"row {row} of the prompts holds a run of {item} tokens ({self.image_token}) that is not a "
                        f"whole number of {items} of {tokens} tokens each",
                        fix=f"pass the processor's input_ids for {items} of the size the model was converted with",
                    )
                leading = min(self.before, text)  # the text tokens before the image its block lays out
                current -= leading
                laid = self.laid(current, number)[:, self.before - leading :]
                positions[:, row, kept[index - leading : index + tokens]] = laid
                current, index, number, text = current + self.extent, index + tokens, number + 1, 0
        return positions

    @staticmethod
    def next_positions(positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each row's next position [rows, 1]: one more than its largest (padding excluded)."""
        kept = positions.amax(0).masked_fill(mask == 0, -1)
        return kept.amax(-1, keepdim=True) + 1

    def to_json(self) -> dict[str, Any]:
        """What :meth:`from_json` reads back."""
        masks = {
            name: value.tolist()
            for name, value in (("anchored", self.anchored), ("counted", self.counted))
            if value is not None
        }
        before = {"before": self.before} if self.before else {}
        return {
            "block": self.block.tolist(),
            "extent": self.extent,
            "image_token": self.image_token,
            **masks,
            **before,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ImagePositions:
        """The positions :meth:`to_json` wrote."""
        masks = {name: torch.tensor(value[name], dtype=torch.bool) for name in ("anchored", "counted") if name in value}
        block = torch.tensor(value["block"], dtype=torch.int64)
        before = int(value.get("before", 0))
        return cls(block, int(value["extent"]), int(value["image_token"]), **masks, before=before)


def feature_order(is_image: torch.Tensor) -> torch.Tensor:
    """The row of the image features each token of ``is_image`` [rows, tokens] takes, flattened: the n-th image token
    (row after row) takes row n, as the model's ``masked_scatter`` fills them; -1 before the first image token (a text
    token's value is never read)."""
    return is_image.reshape(-1).to(torch.int64).cumsum(0) - 1


def gathered_rows(rows: torch.Tensor, is_image: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor shaped as ``like`` [B, S, hidden] (and of its type) whose n-th image token (row after row) holds the
    n-th row of ``rows`` (:func:`feature_order`); written as a gather, which a traced step exports without
    ``NonZero``. The other tokens hold a clamped row: the caller keeps its own values there."""
    order = feature_order(is_image).clamp(min=0).clamp(max=rows.shape[0] - 1)
    return rows.to(like.dtype).index_select(0, order).reshape(like.shape)


def plural(item: str) -> str:
    """How the errors name several items of a modality: ``"images"``, ``"audio clips"``, ``"videos"``."""
    return {"image": "images", "audio": "audio clips"}.get(item, f"{item}s")


def image_rows(inputs: dict[str, torch.Tensor], item: str = "image") -> list[dict[str, torch.Tensor]]:
    """The image inputs cut into one dict per image. Inputs have one leading row per image, except inputs of flattened
    patches (Qwen2-VL's ``pixel_values`` [patches of every image, patch values]), which an integer grid input
    ([images, axes]: ``image_grid_thw``'s frames, rows and columns of patches) divides: each image takes the product
    of its grid row in patches; or inputs of one leading row packing every image's patches along their last axis
    (MiniCPM-V's ``pixel_values`` [1, C, p, p * patches], :func:`_packed_rows`), which the grid divides the same way.
    ``item`` names what one row is in the errors (``"audio"`` for an audio-language
    module's audio inputs: "audio clips").

    >>> [list(cut) for cut in image_rows({"input_features": torch.zeros(2, 8, 4)}, item="audio")]
    [['input_features'], ['input_features']]
    """
    items = plural(item)
    leading = {name: int(value.shape[0]) for name, value in inputs.items() if value.dim()}
    for grid in inputs.values():
        if grid.dim() != 2 or grid.is_floating_point() or grid.dtype == torch.bool or grid.shape[1] < 2:
            continue
        sizes = grid.prod(-1).tolist()
        images, total = len(sizes), sum(sizes)
        if total == images:
            continue
        if total not in leading.values():
            packed = _packed_rows(inputs, sizes)
            if packed is None:
                continue
            return packed
        odd = sorted(name for name, rows in leading.items() if rows not in (images, total))
        if odd:
            raise InputError(
                f"the {item} inputs {', '.join(odd)} have neither one row per {item} ({images}) nor one per patch of "
                f"the grid ({total})",
                fix=f"pass the processor's {item} inputs for the same {items}",
            )
        starts = [0, *itertools.accumulate(sizes)]
        return [
            {
                name: value[starts[i] : starts[i + 1]] if leading.get(name) == total else value[i : i + 1]
                for name, value in inputs.items()
            }
            for i in range(images)
        ]
    counts = set(leading.values())
    if len(counts) > 1:
        rows = ", ".join(f"{name} {count}" for name, count in sorted(leading.items()))
        raise InputError(
            f"the {item} inputs have different numbers of {items} {sorted(counts)} (leading rows: {rows})",
            fix=f"pass the processor's {item} inputs for the same {items} (one leading row per {item})",
        )
    return [{name: value[i : i + 1] for name, value in inputs.items()} for i in range(counts.pop() if counts else 0)]


def _packed_rows(inputs: dict[str, torch.Tensor], sizes: list[int]) -> list[dict[str, torch.Tensor]] | None:
    """The inputs cut into one dict per image where every image's patches lie side by side along the last axis of one
    leading row (NaViT packing, MiniCPM-V's ``pixel_values`` [1, C, p, p * patches of every image]) and the other
    inputs have one leading row per image (the grid, ``sizes`` its patches per image): each image takes its patches'
    share of the last axis (the same number of columns per patch). None for any other layout, or a single image."""
    images, total = len(sizes), sum(sizes)
    if images < 2:
        return None
    packed = [name for name, value in inputs.items() if value.dim() > 1 and value.shape[0] == 1]
    if not packed or any(inputs[name].shape[-1] % total for name in packed):
        return None
    if any(value.dim() == 0 or value.shape[0] != images for name, value in inputs.items() if name not in packed):
        return None
    starts = [0, *itertools.accumulate(sizes)]
    columns = {name: inputs[name].shape[-1] // total for name in packed}
    return [
        {
            name: value[..., starts[i] * columns[name] : starts[i + 1] * columns[name]]
            if name in columns
            else value[i : i + 1]
            for name, value in inputs.items()
        }
        for i in range(images)
    ]
