"""Caches whose keys and values differ in width, and attention whose values are narrower than its queries:
multi-head latent attention (DeepSeek-V3, Kimi K2, Mistral Large 3), whose transformers cache holds a key of one width
and a value of another. A tiny random DeepSeek-V3 generates token for token as transformers' ``generate`` does
(greedy and beams, ONNX ``Attention`` and its decomposition), and TensorRT-RTX's real builder takes its step."""

from __future__ import annotations

from typing import Any

import pytest
import tiny_models
import torch
import transformers

import pipeline
from pipeline.runtime.generation.layout import cache_layout

GENERATION = {"max_length": 40, "max_batch": 4}


def deepseek_v3() -> Any:
    config = transformers.DeepseekV3Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=8,
        max_position_embeddings=64,
    )
    return tiny_models.lively(lambda: transformers.DeepseekV3ForCausalLM(config), 0, 0.3, keep_eos=False)


def prompts() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def model() -> Any:
    return deepseek_v3()


@pytest.mark.parametrize("attention", ["onnx", "decomposed"])
def test_deepseek_v3_generates_as_transformers(model: Any, attention: str) -> None:
    inputs = prompts()
    module = pipeline.convert(model, inputs, generation={**GENERATION, "attention": attention})
    layout = cache_layout(module.io, module.generation.layers)
    widths = {(shape[0], shape[-1]) for shape in layout.shapes}
    assert len({width for _heads, width in widths}) == 2, widths  # keys and values of different widths
    with torch.no_grad():
        greedy = model.generate(**inputs, max_new_tokens=10, do_sample=False)
        beams = model.generate(**inputs, max_new_tokens=6, do_sample=False, num_beams=2)
    assert len(set(greedy[:, 7:].flatten().tolist())) > 4
    assert torch.equal(
        module.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=10), greedy
    )
    assert torch.equal(
        module.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=6, num_beams=2),
        beams,
    )


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_rtx_builds_the_latent_attention_step(precision: str) -> None:
    """The decomposed attention's output takes the value's width (the builder refused the query's: "reshape changes
    volume"). In float16 too the attention is decomposed: TensorRT's attention layer refused keys wider than values
    ("Key and Value must have the same shape"), which sent Kimi K2.5's step to ONNX Runtime segments."""
    pytest.importorskip("tensorrt_rtx")
    options = {"backend": "tensorrt-rtx", "precision": precision, "trt_engine_cache": False}  # built here
    module = pipeline.convert(deepseek_v3(), prompts(), generation=GENERATION, validate=False, **options)
    assert module.engine_bytes and not getattr(module, "segments", None)
    assert module.generation.attention == "decomposed"
