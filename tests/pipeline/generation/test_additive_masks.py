"""A model whose attention takes an additive mask it made itself from the step's boolean one: Doge's dynamic mask
attention adds a learned bias per key (the dtype's minimum where masked). The step's attention takes such a mask as a
bias on the scores and the keys it leaves finite as the mask (it refused any mask but a boolean one before). A tiny
Doge decodes a left-padded batch as transformers does (greedy tokens, every step's scores within 1e-3, 4 beams).
Not covered: a ``keep_window_size`` shorter than the context (Doge's top-k over its keys), where a left-padded batch
fails validation (an AccuracyError, not silent; real checkpoints keep 2048 keys)."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import pytest
import torch
import transformers
from tiny_models import decodes_as_transformers, lively

import pipeline
from pipeline.runtime.executors import EngineNotRunnableWarning

RTX = importlib.util.find_spec("tensorrt_rtx") is not None
GENERATION = {"max_length": 32, "max_batch": 8}


def doge() -> Any:
    config = transformers.DogeConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        keep_window_size=64,  # its top-k over the keys off (shorter windows: see the module docstring)
        is_moe=False,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    model = lively(lambda: transformers.DogeForCausalLM(config), seed=3, std=0.2, keep_eos=False)
    with torch.no_grad():  # a trained model's per-head rates (zeros at init: every key's bias ties, top-k arbitrary)
        for layer in model.model.layers:
            layer.self_attn.A.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(5))
    return model


def test_doges_dynamic_mask_decodes_as_transformers() -> None:
    model = doge()
    ids = torch.randint(3, 90, (2, 11), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    module = pipeline.convert(model, ids[:1], generation=GENERATION)  # validated
    expected, _ = decodes_as_transformers(model, module, inputs, max_new_tokens=8, pad_token_id=0)
    assert len(set(expected[:, 11:].flatten().tolist())) > 3


@pytest.mark.skipif(not RTX, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_builds_doges_step_in_fp16() -> None:
    """The bias per head and the one-head mask of the keys any head keeps: the real builder builds the fp16 step."""
    ids = torch.randint(3, 90, (1, 11), generator=torch.Generator().manual_seed(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineNotRunnableWarning)
        module = pipeline.convert(
            doge(), ids, generation=GENERATION, precision="fp16", validate=False, backend="tensorrt-rtx",
            trt_engine_cache=False,
        )  # fmt: skip
    assert module.engine_bytes
    assert module.report.precision is not None and module.report.precision.dtype == "float16"
