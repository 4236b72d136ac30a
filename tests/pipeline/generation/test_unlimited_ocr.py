"""Unlimited-OCR (``convert(..., generation=...)``): its cache layers keep the prompt's keys and values under names of
their own and the last ``sliding_window`` generated tokens, evicting older ones
(:mod:`pipeline.generation.kept_windows`); generation masks each generated token out as the model evicts it. The
every-type source's model with its window narrowed to 4, converted once (for TensorRT-RTX when it imports: its real
builder builds both graphs):

- two prompts of one length, each with an image, decode 12 new tokens (evicting from the 5th on) as ``model.generate``
  does: greedy tokens, every step's scores, 4-beam sequences, and so does the module saved and loaded; a model
  keeping every token decodes otherwise;
- a left-padded batch decodes as ``model.generate`` while nothing is evicted. Past that, each of its rows decodes as
  ``model.generate`` decodes that prompt alone: transformers' own padded batch then reads the padding mask shifted by
  its window's offset (it attends a row's padding once it evicts), so its padded rows part from its own unpadded ones.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
from model_sources import transformers_all_models as every
from tiny_models import converted_for_rtx_when_it_imports, decodes_as_transformers, drawn_by_fan_in, greedy_scores

import pipeline

WINDOW = 4
NEW = 12


def test_decodes_as_transformers_evicting_generated_tokens_past_its_window(tmp_path: Path) -> None:
    model, (_args, sample) = every.build("unlimited_ocr", "UnlimitedOcrForConditionalGeneration")
    text = model.config.get_text_config()
    text.sliding_window = WINDOW
    model = drawn_by_fan_in(model)
    ids, mask, pixels = sample["input_ids"], sample["attention_mask"], sample["pixel_values"]
    pad = torch.zeros(1, 2, dtype=ids.dtype)
    padded: dict[str, Any] = {  # the first left-padded by two, the second two text tokens longer; another image
        "input_ids": torch.cat([torch.cat([pad, ids], 1), torch.cat([ids[:, -2:], ids], 1)]),
        "attention_mask": torch.cat([torch.cat([pad, mask], 1), torch.ones(1, ids.shape[1] + 2, dtype=mask.dtype)]),
        "pixel_values": torch.cat([pixels, torch.randn_like(pixels)]),
    }
    module = converted_for_rtx_when_it_imports(model, padded, {"max_length": 40, "max_batch": 8})
    assert module.generation.kept_window == WINDOW
    if importlib.util.find_spec("tensorrt_rtx") is not None:  # its real builder built both graphs
        assert module.vision.engine_bytes and module.step.engine_bytes

    row = padded["input_ids"][1:].repeat(2, 1)  # the second prompt twice, with both images: one length, no padding
    level = {**padded, "input_ids": row, "attention_mask": torch.ones_like(row, dtype=mask.dtype)}
    expected, _ = decodes_as_transformers(model, module, level, max_new_tokens=NEW)
    text.sliding_window = 1000  # every token kept: the eviction is what the test decodes (it can fail)
    assert not torch.equal(greedy_scores(model.generate, level, max_new_tokens=NEW)[0], expected)
    text.sliding_window = WINDOW
    module.save(tmp_path / "unlimited_ocr")  # the window is saved with the module
    loaded = pipeline.load(tmp_path / "unlimited_ocr")
    assert loaded.generation.kept_window == WINDOW
    assert torch.equal(greedy_scores(loaded.generate, level, max_new_tokens=NEW)[0], expected)

    decodes_as_transformers(model, module, padded, max_new_tokens=WINDOW + 1)  # nothing evicted yet
    tokens, _ = greedy_scores(module.generate, padded, max_new_tokens=NEW)
    for row, start in ((0, 2), (1, 0)):
        alone = {name: value[row : row + 1, start:] for name, value in padded.items() if name != "pixel_values"}
        alone["pixel_values"] = padded["pixel_values"][row : row + 1]
        theirs, _ = greedy_scores(model.generate, alone, max_new_tokens=NEW)
        assert torch.equal(tokens[row, -NEW:], theirs[0, -NEW:]), row
