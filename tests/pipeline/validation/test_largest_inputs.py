"""Validation's largest inputs (pipeline.validation.stage.validation_feeds): a graph's dynamic dimensions all at
their max together (the engine profile's largest shape); a generation step's named dimensions each at its max
alone, the others at the sample's size: not ``max_batch`` prompts that each fill the whole cache."""

from __future__ import annotations

import dataclasses

import torch

from converters.generation_settings import GenerationSettings
from pipeline.exporting.stage import export
from pipeline.settings import DynamicDim, Settings
from pipeline.validation.stage import validation_feeds


class _Step(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (input_ids * attention_mask).sum(-1)


def _shapes(generation: GenerationSettings | None) -> list[tuple[tuple[int, ...], ...]]:
    sample = (torch.ones(2, 8, dtype=torch.int64), torch.ones(2, 8, dtype=torch.int64))
    dims = tuple(
        DynamicDim(name, axis, label, 1, opt, top)
        for name in ("input_ids", "attention_mask")
        for axis, label, opt, top in ((0, "batch", 1, 4), (1, "sequence", 8, 64))
    )
    settings = Settings(dynamic=dims, validation_inputs=1)
    io = export(_Step(), sample, Settings()).io  # the inputs' names and order: all the feeds need
    feeds = validation_feeds(io, list(sample), dataclasses.replace(settings, generation=generation))
    return [tuple(tuple(feed[spec.name].shape) for spec in io.inputs) for feed in feeds]


def test_a_graph_is_validated_at_its_profiles_largest_shape() -> None:
    # the sample, one draw like it, all at min, all at max
    assert _shapes(None) == [((2, 8), (2, 8)), ((2, 8), (2, 8)), ((1, 1), (1, 1)), ((4, 64), (4, 64))]


def test_a_generation_step_is_validated_at_each_dimensions_max_alone() -> None:
    shapes = _shapes(GenerationSettings(max_length=64, max_batch=4))
    assert shapes[2:] == [((1, 1), (1, 1)), ((4, 8), (4, 8)), ((2, 64), (2, 64))]
    assert ((4, 64), (4, 64)) not in shapes
