"""UDOP (``convert(..., generation=...)``): a T5-like encoder-decoder whose encoder takes each token's box
(``bbox``) and a page image, and adds to each token the image patch under its box's centre. Its encoder builds that
in Python from the boxes' values (``combine_image_text_embeddings``: ``rows, cols = zip(*ind)``, then
``patch_inds[rows, cols] = False``, then per row the patches no box covers, padded by a Python list as long as their
count), which no graph can hold: the export names the line where the model reads the boxes' values and the fix,
instead of PyTorch's "data is not allocated yet". A model of our own that indexes by tuples of a tensor's elements
fails the same way: the rule is not UDOP's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from tiny_models import lively

import pipeline
from converters.errors import ExportError

GENERATION: dict[str, Any] = {"max_length": 16, "max_batch": 4}


@pytest.fixture(scope="module")
def udop() -> transformers.UdopForConditionalGeneration:
    config = transformers.UdopConfig(
        vocab_size=96,
        d_model=32,
        d_kv=16,
        d_ff=48,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        max_2d_position_embeddings=64,
        image_size=32,  # 4x4 patches of 8
        patch_size=8,
        decoder_start_token_id=0,
    )
    return lively(lambda: transformers.UdopForConditionalGeneration(config), seed=0, std=0.4, keep_eos=False)


@pytest.fixture(scope="module")
def prompts() -> dict[str, torch.Tensor]:
    """Two prompts of six tokens, the second right-padded (its pads' boxes all zero, as UDOP's processor pads them),
    the tokens' boxes in a row across the page, and a page image each."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 96, (2, 6), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    left = torch.arange(6, dtype=torch.float32) / 6
    top = torch.full((6,), 0.25)
    boxes = torch.stack([left, top, left + 1 / 6, top + 0.1], dim=-1)[None].repeat(2, 1, 1)
    boxes[1, -2:] = 0
    pixels = torch.randn(2, 3, 32, 32, generator=generator)
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "bbox": boxes, "pixel_values": pixels}


def test_udop_generates_eagerly(udop: Any, prompts: dict[str, torch.Tensor]) -> None:
    tokens = udop.generate(**prompts, max_new_tokens=4, do_sample=False)
    assert tokens.shape == (2, 5)


def test_udop_export_names_where_its_boxes_are_read(udop: Any, prompts: dict[str, torch.Tensor]) -> None:
    with pytest.raises(ExportError) as info:
        pipeline.convert(udop, prompts, generation=GENERATION, validate=False)
    error = info.value
    assert "reads a tensor's values as Python numbers" in error.message
    assert "patch_inds[rows, cols]" in error.message  # the model's own line, quoted
    assert error.node is not None and "combine_image_text_embeddings" in error.node
    assert error.fix is not None and "torch.stack" in error.fix


class _IndexByElements(torch.nn.Module):
    """Zeroes the positions ``points`` lists ([n, 2]: row, column), indexing by tuples of its elements."""

    def forward(self, x: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        rows, cols = zip(*points, strict=True)
        y[rows, cols] = 0.0
        return y


def test_index_by_a_tensors_elements_is_named() -> None:
    model = _IndexByElements()
    sample = (torch.randn(3, 4), torch.tensor([[0, 1], [2, 3]]))
    assert model(*sample)[[0, 2], [1, 3]].eq(0).all()  # it runs eagerly
    with pytest.raises(ExportError) as info:
        pipeline.convert(model, sample, validate=False)
    assert "reads a tensor's values as Python numbers" in info.value.message
    assert "y[rows, cols] = 0.0" in info.value.message
    assert info.value.node is not None and "forward" in info.value.node
