"""Inkling 2's attention: a sink logit per head *and query* (projected from each token: ``sinks`` [batch, heads, steps,
1]) joins each query's softmax beside a relative position bias, and an attention over the block states of the
earlier layers runs without a mask in a module that is not causal (its "heads" are the sequence's positions). The
step's attention computes both as transformers' eager attention does (before, it refused the sinks by name and
took no attention without a mask). A tiny Inkling 2 text model from a config built here (random weights, nothing
downloaded) decodes as transformers' own ``model.generate`` on a left-padded batch."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers
from tiny_models import converted_for_rtx_when_it_imports, decodes_as_transformers, drawn_by_fan_in, left_padded
from transformers.models.inkling2.modeling_inkling2 import eager_attention_forward

from converters.errors import InputError
from pipeline.generation.step_attention import step_attention


class Attention(torch.nn.Module):
    """What transformers' eager attention reads of its module."""

    def __init__(self, groups: int, causal: bool = True) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, causal


def tensors(seed: int) -> tuple[torch.Tensor, ...]:
    """Queries [2, 4 heads, 3 steps, 8], keys and values [2, 2 heads, 6, 8], per-query sinks [2, 4, 3, 1] drawn
    large enough to matter, a position bias [2, 4, 3, 6] and a causal mask over 6 keys (steps at 3-5), whose first
    row is left-padded by 2."""
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (
        torch.randn(2, heads, steps, 8, generator=generator) for heads, steps in ((4, 3), (2, 6), (2, 6))
    )
    sinks, bias = 3 * torch.randn(2, 4, 3, 1, generator=generator), torch.randn(2, 4, 3, 6, generator=generator)
    mask = (torch.arange(6).view(1, 1, 1, 6) <= torch.arange(3, 6).view(1, 1, 3, 1)).expand(2, 1, 3, 6).clone()
    mask[0, :, :, :2] = False
    return query, key, value, sinks, bias, mask


def test_per_query_sinks_and_bias_are_computed_as_transformers_eager_attention() -> None:
    query, key, value, sinks, bias, mask = tensors(0)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    module = Attention(groups=2)
    expected, _ = eager_attention_forward(module, query, key, value, additive, 0.3, position_bias=bias, sinks=sinks)
    got, _ = step_attention(module, query, key, value, mask, scaling=0.3, position_bias=bias, sinks=sinks)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    without, _ = eager_attention_forward(module, query, key, value, additive, 0.3, position_bias=bias)
    assert float((without - expected).abs().max()) > 0.05, "the sinks drawn here would not show"


def test_an_attention_without_mask_in_a_module_not_causal_sees_every_key() -> None:
    query, key, value, *_ = tensors(1)
    module = Attention(groups=2, causal=False)
    expected, _ = eager_attention_forward(module, query, key, value, None, 0.3)
    got, _ = step_attention(module, query, key, value, None, scaling=0.3)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_sinks_of_another_shape_and_causal_attention_without_mask_are_refused_by_name() -> None:
    query, key, value, sinks, _, mask = tensors(2)
    refusals = {
        r"Attention's sinks of shape \(2, 4, 3\)": lambda: step_attention(
            Attention(2), query, key, value, mask, sinks=sinks[..., 0]
        ),
        "Attention hands s_aux and sinks": lambda: step_attention(
            Attention(2), query, key, value, mask, sinks=sinks, s_aux=torch.zeros(4)
        ),
        "in Attention takes attention sinks or a softcap, not both": lambda: step_attention(
            Attention(2), query, key, value, mask, sinks=sinks, softcap=30.0
        ),
        "in Attention needs a boolean mask over the cache, got none": lambda: step_attention(
            Attention(2), query, key, value, None
        ),
        # nor dropped where there is no mask
        "does not compute the alibi": lambda: step_attention(
            Attention(2, causal=False), query, key, value, None, alibi=torch.zeros(1, 4, 1, 6)
        ),
    }
    for message, call in refusals.items():
        with pytest.raises(InputError, match=message) as refused:
            call()
        assert refused.value.fix == "convert without generation= (the plain forward)", message


def inkling2() -> transformers.PreTrainedModel:
    """One sliding-window layer (2 query heads over 1 key-value head, a window of 4), 4 experts, a block of one layer,
    the block-attention queries drawn (transformers starts them at zero: an even average)."""
    config = transformers.Inkling2TextConfig(
        vocab_size=96,
        unpadded_vocab_size=96,
        hidden_size=32,
        num_hidden_layers=1,
        layer_types=["hybrid_sliding"],
        swa_num_attention_heads=2,
        swa_num_key_value_heads=1,
        swa_head_dim=8,
        sliding_window_size=4,
        d_rel=4,
        rel_extent=8,
        max_position_embeddings=64,
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_layers_per_attn_res_block=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.Inkling2ForCausalLM(config))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".query"):
                parameter.normal_(0, 1)
    return model


def test_inkling2_decodes_as_transformers() -> None:
    """Greedy tokens, every step's scores (1e-3) and 4-beam sequences equal transformers' on ONNX Runtime; the step
    converted for TensorRT-RTX when it imports (its real builder builds the graph holding the sinks)."""
    ids, mask = left_padded([7, 9], seed=1)
    model, sample = inkling2(), {"input_ids": ids, "attention_mask": mask}
    module = converted_for_rtx_when_it_imports(model, sample, {"max_length": 24, "max_batch": 8})
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        assert module.report.backend == "tensorrt-rtx" and module.engine_bytes
    expected, _ = decodes_as_transformers(model, module, sample, max_new_tokens=8)
    assert len(set(expected[:, -8:].flatten().tolist())) > 4
