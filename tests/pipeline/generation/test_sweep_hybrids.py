"""Hybrid causal LMs as the every-type sweep's configs build them (benchmarks/causal_lm_families.py):

- Nemotron-H, whose chunked scan clamps its time step from below and whose one-token update does not: a prompt the
  converted module feeds token by token (in the sweep: the leading tokens of a prompt the cache leaves no room to pad
  to whole runs of the prompt graph) decodes otherwise than ``model.generate``, and so does PyTorch's own model fed
  so. Validation fails, and its error
  says that the model's two paths differ in PyTorch itself, not the conversion
  (pipeline/generation/validation.py).
- LFM2 with attention layers alone: its model cuts the prompt's columns off the cache-wide mask for its convolution
  layers (transformers' ``create_recurrent_attention_mask``: ``attention_mask[:, -tokens:]``, contiguous only when
  the prompt fills the cache), a guard torch.export refuses over a prompt range up to the cache's length. A prompt
  leaves one position of the cache at least (``max_prompt`` is ``max_length - 1`` at most), as a vision-language
  step's does.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import pipeline
from converters.errors import AccuracyError


def tiny_nemotron_h() -> transformers.NemotronHForCausalLM:
    """A Mamba-2 layer and an attention layer; every head's time step below ``time_step_min``: the clamp bites."""
    torch.manual_seed(0)
    config = transformers.NemotronHConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        layer_types=["mamba", "attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=8,
        n_groups=1,
        chunk_size=8,
        intermediate_size=64,
        eos_token_id=63,
        pad_token_id=0,
    )
    model = transformers.NemotronHForCausalLM(config).eval()
    with torch.no_grad():
        mixer = model.model.layers[0].mixer
        mixer.dt_bias.copy_(torch.linspace(-20.0, -12.0, mixer.dt_bias.numel()))
        # the scan's inputs 100x (x, B, C): its output above the gated norm's eps, so that the mixer counts
        mixer.in_proj.weight[mixer.intermediate_size : mixer.intermediate_size + mixer.conv_dim].mul_(100.0)
    return model


def test_validation_names_pytorchs_own_paths_when_they_part() -> None:
    """Without a prompt graph (``max_prompt=1``), a prompt goes one token at a time through the one-token update,
    where ``model.generate`` runs it through the clamped chunked scan (the sweep's Nemotron-H: a prompt's leading
    tokens that fill no whole run of the prompt graph, where the cache leaves no room to pad them). The error names
    transformers' two paths, not the conversion."""
    model = tiny_nemotron_h()
    sample = torch.randint(3, 60, (1, 5), generator=torch.Generator().manual_seed(1))
    generation = {"max_length": 14, "max_batch": 1, "max_prompt": 1, "validation_steps": 2}
    with pytest.raises(AccuracyError) as caught:
        pipeline.convert(model, sample, generation=generation)
    message = caught.value.message
    assert message.startswith("the model's one-token and multi-token paths differ in PyTorch itself"), message
    assert "decoding differs from PyTorch's own generate" in message
    assert caught.value.fix is not None and caught.value.fix.startswith("the model's one-token and multi-token paths")


def tiny_attention_lfm2() -> transformers.Lfm2ForCausalLM:
    """LFM2 with no convolution layer (the every-type config's ``layer_types``)."""
    torch.manual_seed(0)
    config = transformers.Lfm2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        layer_types=["full_attention", "full_attention"],
        eos_token_id=63,
        pad_token_id=0,
    )
    return transformers.Lfm2ForCausalLM(config).eval()


def test_attention_only_lfm2_exports_with_a_dynamic_prompt() -> None:
    model = tiny_attention_lfm2()
    ids = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0
    module = pipeline.convert(model, {"input_ids": ids, "attention_mask": mask}, generation={"max_length": 16})
    assert module.generation.max_prompt == 15
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=None)
    assert torch.equal(module.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[]), expected)
