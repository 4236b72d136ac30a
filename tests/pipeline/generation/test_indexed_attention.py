"""DeepSeek sparse attention (DeepSeek-V3.2's, GLM-5's, Mistral Large 4's, HY-V4's "indexed_attention" layers): an
indexer scores every cached position per query and the attention sees only its top-k. Its keys are a cache of their
own, written beside the layer's keys and values; the step holds them as ``past_key_values.{i}.indexer`` and the
model's top-k indices reach the step's attention as ``indices``. A tiny DeepSeek-V3.2 from a config built here
(random weights, nothing downloaded), whose top-k (6) is shorter than its prompts, so that the selection decides the
logits: judged against transformers' own ``model.generate`` on a left-padded batch of two."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import decodes_as_transformers, drawn_by_fan_in, left_padded

import pipeline

GENERATION = {"max_length": 32, "max_batch": 8}


def deepseek_v32() -> transformers.PreTrainedModel:
    """Two layers (a dense MLP, then a mixture of 4 experts), both indexed: top 6 keys by 8 indexer heads (with 2,
    the indexer's ReLU scores tie at zero, and transformers' own static-cache generate parts from its dynamic one)."""
    config = transformers.DeepseekV32Config(
        vocab_size=96,
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
        kv_lora_rank=16,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        head_dim=8,
        index_topk=6,
        index_head_dim=16,
        index_n_heads=8,
        first_k_dense_replace=1,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return drawn_by_fan_in(transformers.DeepseekV32ForCausalLM(config)).eval()


def prompts() -> dict[str, torch.Tensor]:
    """Two prompts of 9 tokens, the first left-padded by 2."""
    ids, mask = left_padded([7, 9], seed=1)
    return {"input_ids": ids, "attention_mask": mask}


def test_indexed_attention_decodes_as_transformers(tmp_path: Path) -> None:
    """Greedy tokens, every step's scores (1e-3) and 4-beam sequences equal transformers'; each layer's indexer keys
    are a cache input of the step, of the cache's capacity; saved and loaded, the module decodes the same."""
    model, sample = deepseek_v32(), prompts()
    module = pipeline.convert(model, sample, generation=GENERATION)  # validated: per-step scores and greedy decoding
    shapes = {spec.name: tuple(spec.shape) for spec in module.io.inputs if spec.name.endswith(".indexer")}
    assert sorted(shapes) == ["past_key_values.0.indexer", "past_key_values.1.indexer"]
    assert shapes["past_key_values.0.indexer"][1:] == (1, 32, 16)
    expected, _ = decodes_as_transformers(model, module, sample, max_new_tokens=10)
    assert len(set(expected[:, -10:].flatten().tolist())) > 2
    module.save(tmp_path / "dsa")
    loaded = pipeline.load(tmp_path / "dsa")
    with torch.no_grad():
        assert torch.equal(loaded.generate(**sample, max_new_tokens=10, do_sample=False), expected)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_builds_the_indexed_step() -> None:
    """TensorRT-RTX's real builder builds the step (the indexer's TopK and the scattered top-k mask included) with
    its prompt and decode profiles; its engine cannot run here."""
    generation = {**GENERATION, "attention": "decomposed"}
    module = pipeline.convert(deepseek_v32(), prompts(), generation=generation, backend="tensorrt-rtx", validate=False)
    assert module.report.backend == "tensorrt-rtx"
    assert module.engine_bytes
