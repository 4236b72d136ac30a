"""MiniCPM-V 4.7's image positions: each image laid on a canvas that the token before it (its ``<image>`` marker)
opens, at the position that token would take as text on the time axis and one row and column outside the canvas on
the others (never below 0), the image's tokens from that same position, the text after it past the canvas's larger
side. The layout is read from the model at conversion (its block opened by one token before the image) and the runtime
lays out other prompts as the model does: an image at a prompt's start (no token before it), its marker first (the
halo at 0), two images one token apart, other text lengths, a padded batch. A tiny MiniCPM-V 4.7 (random weights,
nothing downloaded; its text model a one-layer Qwen3.5 of full attention on interleaved M-RoPE)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers
from tiny_models import converted_for_rtx_when_it_imports, decodes_as_transformers

import pipeline
from pipeline.generation.image_positions import image_positions

PATCH = 8
GRID = (8, 4)  # rows and columns of patches; a quarter of each on the canvas: 2 tokens, 2 rows by 1 column
IMAGE_TOKEN = 127


def tiny_minicpm_v47() -> torch.nn.Module:
    """A MiniCPM-V 4.7 of two tower layers (the window merger after the first) and a one-layer Qwen3.5 whose rotary
    frequencies take every axis (time, rows, columns)."""
    text = {
        "model_type": "qwen3_5_text",
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "layer_types": ["full_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 100.0, "mrope_section": [4, 2, 2]},
        "partial_rotary_factor": 1.0,
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
    config = transformers.MiniCPMV4_7Config(
        text_config=text, vision_config=vision, insert_layer_id=1, image_token_id=IMAGE_TOKEN
    )
    torch.manual_seed(0)
    model = transformers.MiniCPMV4_7ForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = None
    return model


def prompts(layouts: list[list[int]], seed: int) -> dict[str, torch.Tensor]:
    """A left-padded batch of prompts, each a list of -1 (an image: its 2 tokens) and counts of text tokens, with
    every image's patches side by side in one row (as MiniCPM-V's processor packs them)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for layout in layouts:
        pieces = [
            torch.full((2,), IMAGE_TOKEN) if n < 0 else torch.randint(3, 120, (n,), generator=generator) for n in layout
        ]
        rows.append(torch.cat(pieces))
    length = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, length - len(row) :] = row
        mask[index, length - len(row) :] = 1
    images = sum(layout.count(-1) for layout in layouts)
    pixels = torch.randn(1, 3, PATCH, PATCH * GRID[0] * GRID[1] * images, generator=generator)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": (ids == IMAGE_TOKEN).to(torch.int32),
        "pixel_values": pixels,
        "target_sizes": torch.tensor([GRID] * images),
    }


#: The conversion sample: an image after 3 text tokens, and after 5 in a row left-padded by 2.
SAMPLE = [[3, -1, 4], [5, -1, 4]]
#: Prompts unlike it: an image first, two images one token apart, the marker first, more images, other lengths.
OTHERS = [[-1, 3, -1, 1, -1, 2], [1, -1, 2, -1, 1]]


def model_positions(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's own positions for ``inputs`` [axes, rows, tokens]."""
    found, _deltas = model.model.get_rope_index(
        inputs["input_ids"],
        inputs["mm_token_type_ids"],
        inputs["target_sizes"],
        attention_mask=inputs["attention_mask"],
    )
    return found


def test_the_layout_read_at_conversion_lays_other_prompts_as_the_model() -> None:
    """The layout read from the sample gives every kept token of other prompts the model's own positions."""
    model = tiny_minicpm_v47()
    rule = image_positions(model, prompts(SAMPLE, 1), IMAGE_TOKEN)
    assert rule is not None and rule.before == 1 and rule.extent == 3
    for seed, layouts in enumerate([OTHERS, [[-1, 1, -1, 2], [4, -1, 1, -1, 3]], [[1, -1, 1], [2, -1, 6]]]):
        inputs = prompts(layouts, seed + 2)
        kept = inputs["attention_mask"].bool().unsqueeze(0).expand(3, -1, -1)
        laid = rule.prompt(inputs["input_ids"], inputs["attention_mask"])
        assert torch.equal(laid[kept], model_positions(model, inputs)[kept]), layouts


def test_a_padded_batch_unlike_the_sample_decodes_as_transformers(tmp_path: Path) -> None:
    """Converted on :data:`SAMPLE`, the padded batch :data:`OTHERS` (2 rows, 5 images) decodes as ``model.generate``:
    greedy tokens, every step's scores (1e-3) and 4 beams, saved and loaded; TensorRT-RTX's real builder builds both
    graphs when it imports."""
    model = tiny_minicpm_v47()
    module = converted_for_rtx_when_it_imports(model, prompts(SAMPLE, 1), {"max_length": 32, "max_batch": 8})
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        assert module.vision.engine_bytes and module.step.engine_bytes
    module.save(tmp_path / "minicpmv47")
    loaded = pipeline.load(tmp_path / "minicpmv47")
    inputs = prompts(OTHERS, 5)
    expected, _scores = decodes_as_transformers(model, loaded, inputs, max_new_tokens=4)
    assert len(set(expected[:, -4:].flatten().tolist())) > 2  # the images and prompts reach the tokens
