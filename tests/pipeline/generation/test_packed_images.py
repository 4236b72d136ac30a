"""A batch whose images are packed side by side in one row (NaViT packing: MiniCPM-V's processor lays every image's
patches along the last axis of ``pixel_values`` [1, C, p, p * patches of every image], with ``target_sizes`` [images,
2] of rows and columns of patches): the conversion cuts it into one vision-graph run per image, the share of the last
axis its grid row says, and decodes the padded batch of two as transformers does. A tiny MiniCPM-V 4.6 (random
weights, nothing downloaded; its text model a one-layer Qwen3)."""

from __future__ import annotations

import importlib.util

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers
from tiny_models import converted_for_rtx_when_it_imports, decodes_as_transformers

from converters.errors import InputError
from pipeline.runtime.generation.image_positions import image_rows

PATCH = 8
GRID = (8, 4)  # rows and columns of patches: halved by the tower's window merger and again by the merger, 2 tokens
IMAGE_TOKEN = 100


def strip(generator: torch.Generator) -> torch.Tensor:
    """One image as its patches side by side in one row [1, 3, p, p * patches]."""
    return torch.randn(1, 3, PATCH, PATCH * GRID[0] * GRID[1], generator=generator)


def test_images_packed_in_one_row_are_cut_by_their_grid() -> None:
    """Each image takes its patches' share of the packed row's last axis; its grid row is its own; a row the grid
    does not divide is refused by name."""
    pixels = torch.arange(3 * 2 * 2 * 10, dtype=torch.float32).reshape(1, 3, 2, 20)
    sizes = torch.tensor([[2, 2], [2, 3]])
    cut = image_rows({"pixel_values": pixels, "target_sizes": sizes})
    assert [tuple(c["pixel_values"].shape) for c in cut] == [(1, 3, 2, 8), (1, 3, 2, 12)]
    assert torch.equal(torch.cat([c["pixel_values"] for c in cut], -1), pixels)
    assert [c["target_sizes"].tolist() for c in cut] == [[[2, 2]], [[2, 3]]]
    with pytest.raises(InputError, match="different numbers of images"):
        image_rows({"pixel_values": pixels[..., :19], "target_sizes": sizes})


def tiny_minicpm_v() -> torch.nn.Module:
    """A MiniCPM-V 4.6 of two tower layers (the window merger after the second) and a one-layer Qwen3."""
    text = {
        "model_type": "qwen3",
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "initializer_range": 0.5,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": PATCH,
    }
    config = transformers.MiniCPMV4_6Config(
        text_config=text, vision_config=vision, insert_layer_id=1, image_token_id=IMAGE_TOKEN
    )
    torch.manual_seed(0)
    model = transformers.MiniCPMV4_6ForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = None
    return model


def packed_batch() -> dict[str, torch.Tensor]:
    """Two prompts with an image each (2 image tokens), the first left-padded by 2; both images in one row."""
    generator = torch.Generator().manual_seed(1)
    text = torch.randint(3, 90, (2, 8), generator=generator)
    image = torch.full((2, 2), IMAGE_TOKEN)
    ids = torch.cat([text[:, :2], image, text[:, 2:]], 1)
    ids[0, :2] = 0
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    pixels = torch.cat([strip(generator), strip(generator)], -1)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels, "target_sizes": torch.tensor([GRID] * 2)}


def test_a_batch_packed_in_one_row_decodes_as_transformers() -> None:
    """The padded batch of two, its images packed in one row: greedy tokens, every step's scores (1e-3) and 4 beams as
    ``model.generate``'s (the graphs on ONNX Runtime); TensorRT-RTX's real builder builds both graphs."""
    model = tiny_minicpm_v()
    inputs = packed_batch()
    module = converted_for_rtx_when_it_imports(model, inputs, {"max_length": 32, "max_batch": 8})
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        assert module.vision.engine_bytes and module.step.engine_bytes
    expected, _scores = decodes_as_transformers(model, module, inputs, max_new_tokens=5)
    assert len(set(expected[:, -5:].flatten().tolist())) > 2  # the images and prompts reach the tokens
