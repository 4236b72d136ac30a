"""A vision-language model converted in fp16, its decoding judged against PyTorch's own float16 on the same tokens.

Where the fixed float16 tolerance fails a step's logits, the decoding judge runs the model's ``generate`` once more in
float16 (PyTorch's own half precision) and judges the step within 3x that error. PyTorch's own float16 parts from its
float32 at a near tie too: GLM-4.6V's small config (a 24-block vision tower drawn wider) chose another token at its
step 5 in float16, and steps 6-7 lost their anchor and failed the fixed tolerance, more than 10x (0.307 against PyTorch
float16's own 0.199 on the same tokens). The anchor run is now fed the reference's tokens. Here a tiny LLaVA (real
export, ONNX Runtime) is fed a token path its greedy decoding does not take, and its reference logits stand off its
float16 ones by 5x the fixed tolerance, as a deep tower's do: every step is judged against PyTorch float16 on that
path."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import tiny_models
import torch
import transformers

import pipeline
from pipeline.generation.generate_scores import follow_tokens, greedy_options, judged_logits
from pipeline.settings import Settings

IMAGE = 127
STEPS = 6
PARTED = 2  # the path's new tokens part from the greedy ones from this step on


def llava() -> Any:
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8
    )
    text = transformers.LlamaConfig(**tiny_models.TINY_TEXT, max_position_embeddings=64)
    config = transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=IMAGE, image_seq_length=16
    )
    return tiny_models.lively(
        lambda: transformers.LlavaForConditionalGeneration(config), seed=0, std=0.3, keep_eos=False
    )


def prompts() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (2, 22), generator=torch.Generator().manual_seed(0))
    ids[:, 2:18] = IMAGE
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 0
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": images}


def test_the_half_anchor_follows_the_reference_tokens_past_a_parting() -> None:
    model, inputs = llava(), prompts()
    module = pipeline.convert(
        model, inputs, generation={"max_length": 48, "max_batch": 2}, precision="fp16", validate=False
    )
    options = greedy_options(STEPS)
    width = inputs["input_ids"].shape[1]
    with torch.no_grad():
        greedy = model.generate(**inputs, **options).sequences
    path = greedy.clone()
    path[:, width + PARTED :] = torch.arange(3, 3 + STEPS - PARTED)  # not the greedy tokens: the free run parts
    assert not torch.equal(path[:, width + PARTED], greedy[:, width + PARTED])
    follow = follow_tokens(path)
    with torch.no_grad():
        theirs = model.generate(**inputs, **options, logits_processor=follow)
    ours = module.generate(**inputs, **options, logits_processor=follow)
    assert torch.equal(theirs.sequences, path) and torch.equal(ours.sequences, path)
    # the reference stands off float16 by 5x the fixed tolerance (1% of the logits' RMS): PyTorch's own float16 too
    offsets = [
        0.05 * float(t.pow(2).mean().sqrt()) * torch.randn(t.shape, generator=torch.Generator().manual_seed(s)).sign()
        for s, t in enumerate(theirs.logits)
    ]
    standing_off = SimpleNamespace(
        sequences=theirs.sequences, logits=tuple(t + d for t, d in zip(theirs.logits, offsets, strict=True))
    )
    reference = functools.partial(model.generate, **inputs, **options)  # as validation calls it: no processor
    report = judged_logits(
        ours, standing_off, module.step.io, Settings(precision="fp16"), "sample", width, reference, model
    )
    assert report is not None and len(report.per_step) == STEPS
    # every step, those past the parting too, judged within PyTorch float16's own error on the same tokens
    assert [s.step for s in report.per_step if not s.passed] == []
