"""Positions on several axes for a prompt with images (multimodal rotary positions, M-RoPE: Qwen2-VL and the models
built on it), and how a request's images are cut into one vision-graph run each.

A model of this kind gives every token a position per axis ([axes, batch, tokens]: time, rows, columns). A text
token's position is the same on every axis and one more than the token before it; an image's tokens take a block of
positions laid out over its patch grid, offset by where the image starts, and the text after the image goes on from
that start plus the image's extent (not its token count). The block and the extent depend only on the image's grid,
which the vision graph holds fixed: they are read from the model's own positions on the conversion sample
(:mod:`pipeline.generation.image_positions`) and stored here. After the prompt every new token is text: one more than
the row's largest position so far, on every axis (what the model's ``generate`` computes from its ``rope_deltas``).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch

from converters.errors import InputError


@dataclasses.dataclass(frozen=True)
class ImagePositions:
    """An image's positions relative to its start (``block`` [axes, image tokens]) and how far the next token's
    position is past that start (``extent``), for the model's image token."""

    block: torch.Tensor
    extent: int
    image_token: int

    @property
    def axes(self) -> int:
        """The number of position axes (3: time, rows, columns)."""
        return int(self.block.shape[0])

    def prompt(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The prompts' positions [axes, rows, tokens] (padding at 1, as the single-axis step's)."""
        rows, length = ids.shape
        tokens = int(self.block.shape[1])
        positions = torch.ones(self.axes, rows, length, dtype=torch.int64)
        for row in range(rows):
            kept = torch.nonzero(mask[row]).flatten().tolist()
            current, index = 0, 0
            while index < len(kept):
                column = kept[index]
                if int(ids[row, column]) != self.image_token:
                    positions[:, row, column] = current
                    current, index = current + 1, index + 1
                    continue
                run = kept[index : index + tokens]
                if len(run) < tokens or any(int(ids[row, c]) != self.image_token for c in run):
                    raise InputError(
                        f"row {row} of the prompts holds a run of image tokens ({self.image_token}) that is not a "
                        f"whole number of images of {tokens} tokens each",
                        fix="pass the processor's input_ids for images of the size the model was converted with",
                    )
                positions[:, row, run] = self.block + current
                current, index = current + self.extent, index + tokens
        return positions

    @staticmethod
    def next_positions(positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each row's next position [rows, 1]: one more than its largest (padding excluded)."""
        kept = positions.amax(0).masked_fill(mask == 0, -1)
        return kept.amax(-1, keepdim=True) + 1

    def to_json(self) -> dict[str, Any]:
        """What :meth:`from_json` reads back."""
        return {"block": self.block.tolist(), "extent": self.extent, "image_token": self.image_token}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ImagePositions:
        """The positions :meth:`to_json` wrote."""
        return cls(torch.tensor(value["block"], dtype=torch.int64), int(value["extent"]), int(value["image_token"]))


def image_rows(inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The image inputs cut into one dict per image. Inputs have one leading row per image, except inputs of flattened
    patches (Qwen2-VL's ``pixel_values`` [patches of every image, patch values]), which an integer grid input
    ([images, axes]: ``image_grid_thw``'s frames, rows and columns of patches) divides: each image takes the product
    of its grid row in patches."""
    leading = {name: int(value.shape[0]) for name, value in inputs.items() if value.dim()}
    for grid in inputs.values():
        if grid.dim() != 2 or grid.is_floating_point() or grid.dtype == torch.bool or grid.shape[1] < 2:
            continue
        sizes = grid.prod(-1).tolist()
        images, total = len(sizes), sum(sizes)
        if total == images or total not in leading.values():
            continue
        odd = sorted(name for name, rows in leading.items() if rows not in (images, total))
        if odd:
            raise InputError(
                f"the image inputs {', '.join(odd)} have neither one row per image ({images}) nor one per patch of "
                f"the grid ({total})",
                fix="pass the processor's image inputs for the same images",
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
        raise InputError(
            f"the image inputs have different numbers of images {sorted(counts)}",
            fix="pass the processor's image inputs for the same images",
        )
    return [{name: value[i : i + 1] for name, value in inputs.items()} for i in range(counts.pop() if counts else 0)]
