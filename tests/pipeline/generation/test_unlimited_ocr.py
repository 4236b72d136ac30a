"""Unlimited-OCR (``convert(..., generation=...)``): its cache layers keep the prompt's keys and values under names of
their own and a window of generated tokens (:mod:`pipeline.generation.kept_windows`). The every-type source's model
with its window narrowed to 24, a left-padded batch of two prompts with an image each: converted with the longest
``max_length`` the window allows (26: a prompt of one token may generate 25 and the window holds them), greedy tokens
and every step's scores and 4-beam sequences as ``model.generate`` gives them; a longer ``max_length`` is refused by
name."""

from __future__ import annotations

import importlib.util

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
from model_sources import transformers_all_models as every
from tiny_models import converted_for_rtx_when_it_imports, decodes_as_transformers, drawn_by_fan_in

import pipeline
from converters.errors import InputError

WINDOW = 24


def test_decodes_as_transformers_within_its_window_and_refuses_past_it() -> None:
    model, (_args, sample) = every.build("unlimited_ocr", "UnlimitedOcrForConditionalGeneration")
    model.config.get_text_config().sliding_window = WINDOW
    model = drawn_by_fan_in(model)
    ids, mask = sample["input_ids"], sample["attention_mask"]
    pad = torch.zeros(1, 2, dtype=ids.dtype)
    inputs = {  # the second prompt two text tokens longer, the first left-padded by two; another image
        "input_ids": torch.cat([torch.cat([pad, ids], 1), torch.cat([ids[:, -2:], ids], 1)]),
        "attention_mask": torch.cat([torch.cat([pad, mask], 1), torch.ones(1, ids.shape[1] + 2, dtype=mask.dtype)]),
        "pixel_values": torch.cat([sample["pixel_values"], torch.randn_like(sample["pixel_values"])]),
    }
    with pytest.raises(InputError, match=f"the last {WINDOW} generated tokens"):
        pipeline.convert(model, inputs, generation={"max_length": 64, "max_batch": 8}, validate=False)
    module = converted_for_rtx_when_it_imports(model, inputs, {"max_length": WINDOW + 2, "max_batch": 8})
    if importlib.util.find_spec("tensorrt_rtx") is not None:  # its real builder built both graphs
        assert module.vision.engine_bytes and module.step.engine_bytes
    decodes_as_transformers(model, module, inputs, max_new_tokens=WINDOW + 2 - inputs["input_ids"].shape[1])
