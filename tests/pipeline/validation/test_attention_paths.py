"""A transformers model whose PyTorch 'sdpa' attention skips the causal mask it builds (AIMv2's text tower: attention
modules with is_causal=False under a causal mask) fails validation with the cause named and the fix that works;
converted after that fix, it matches. A model whose 'sdpa' and 'eager' paths agree gets no such cause."""

from __future__ import annotations

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
import transformers

import pipeline
from pipeline.validation.attention_paths import SDPA_DISAGREES


def _aimv2_text(hidden: int = 32, layers: int = 2) -> transformers.PreTrainedModel:
    config = transformers.Aimv2TextConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=2, max_position_embeddings=16, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.Aimv2TextModel(config).eval()


def _sample() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_the_skipped_causal_mask_is_named_with_its_fix() -> None:
    model = _aimv2_text()
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(pipeline.AccuracyError) as caught:
        pipeline.convert(model, ((), _sample()), validation_inputs=1)
    assert SDPA_DISAGREES in str(caught.value)
    assert "set_attn_implementation('eager')" in caught.value.fix
    assert model.config._attn_implementation == "sdpa"  # put back after the check

    model.set_attn_implementation("eager")
    module = pipeline.convert(model, ((), _sample()), validation_inputs=1)
    assert module.report.accuracy is not None and module.report.accuracy.passed


def test_no_such_cause_when_the_two_attention_paths_agree() -> None:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    with pytest.raises(pipeline.AccuracyError) as caught:  # a tolerance nothing meets: fails for another reason
        pipeline.convert(model, ((), _sample()), validation_inputs=1, tolerances={"float32": (0.0, 0.0)})
    assert SDPA_DISAGREES not in str(caught.value)


def test_the_skipped_causal_mask_is_named_in_float16() -> None:
    """A float16 graph is not within 1e-3 of PyTorch's 'eager' path (2e-3 here), but far closer to it than 'sdpa' is."""
    model = _aimv2_text(hidden=64, layers=4)
    with pytest.raises(pipeline.AccuracyError) as caught:
        pipeline.convert(model, ((), _sample()), validation_inputs=1, precision="fp16")
    assert SDPA_DISAGREES in str(caught.value)
