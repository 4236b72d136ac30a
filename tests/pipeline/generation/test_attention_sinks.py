"""Attention sinks (gpt-oss's; HY-V4's): one learned logit per head joins every query's softmax as a key with no
value, and takes its share of the probability. transformers hands it to the attention function as ``s_aux``; the
step's attention computes it (before, it dropped the argument, and the conversion's validation refused gpt-oss with
every step's logits 0.5-3.8 away). A tiny gpt-oss from a config built here (random weights, nothing downloaded),
its sinks drawn large enough to matter, judged against transformers' own ``model.generate`` on a left-padded batch."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers
from tiny_models import decodes_as_transformers, drawn_by_fan_in, left_padded

import pipeline
from converters.errors import InputError

GENERATION = {"max_length": 24, "max_batch": 8}


def gpt_oss() -> transformers.PreTrainedModel:
    """Two layers (a sliding window of 4, then full attention), 4 experts, sinks drawn with standard deviation 2."""
    config = transformers.GptOssConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.GptOssForCausalLM(config)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("sinks"):
                parameter.normal_(0, 2)
    return model


def prompts() -> dict[str, torch.Tensor]:
    """Two prompts of 9 tokens, the first left-padded by 2."""
    ids, mask = left_padded([7, 9], seed=1)
    return {"input_ids": ids, "attention_mask": mask}


def test_attention_sinks_decode_as_transformers() -> None:
    """Greedy tokens, every step's scores (1e-3) and 4-beam sequences equal transformers'."""
    model, sample = gpt_oss(), prompts()
    module = pipeline.convert(model, sample, generation=GENERATION, validate=False)
    expected, _ = decodes_as_transformers(model, module, sample, max_new_tokens=8)
    assert len(set(expected[:, -8:].flatten().tolist())) > 2


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_builds_a_step_with_sinks() -> None:
    """TensorRT-RTX's real builder builds the step whose attention holds the sinks (its engine cannot run here)."""
    generation = {**GENERATION, "attention": "decomposed"}
    module = pipeline.convert(gpt_oss(), prompts(), generation=generation, backend="tensorrt-rtx", validate=False)
    assert module.report.backend == "tensorrt-rtx" and module.engine_bytes


def test_attention_arguments_the_step_does_not_compute_are_refused_by_name() -> None:
    """A tensor the step's attention would drop (Inkling 2's per-query ``sinks``, ALiBi slopes) is an error naming it,
    not attention computed without it."""
    from pipeline.generation.step_attention import step_attention

    query = key = value = torch.zeros(1, 2, 3, 4)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    with pytest.raises(InputError, match="does not compute the alibi Module hands"):
        step_attention(torch.nn.Module(), query, key, value, mask, alibi=torch.zeros(1, 2, 1, 3))


def test_a_tensor_the_step_does_not_read_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A tensor handed to the attention that the step neither computes nor knows restates its mask is named in a
    warning (once per module type and name), not passed over in silence."""
    from pipeline.generation.step_attention import step_attention

    class Unusual(torch.nn.Module):
        """An attention module handing a tensor of its own."""

    query = key = value = torch.zeros(1, 2, 3, 4)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    with caplog.at_level("WARNING", logger="pipeline.generation.ops"):
        for _ in range(2):
            step_attention(Unusual(), query, key, value, mask, gate_bias=torch.zeros(3), position_ids=torch.zeros(3))
    said = [r.getMessage() for r in caplog.records if "does not read" in r.getMessage()]
    assert said == ["the step's attention does not read the gate_bias Unusual hands it (validation judges it)"]
