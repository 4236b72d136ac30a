"""The model suite's shrunk configs (``tests/model_sources/``) are ones a real checkpoint could have: a model that
runs eagerly only by luck of our config's sizes would put a false failure in the coverage table."""

from __future__ import annotations

import torch
from model_sources import transformers_models


def test_deepseek_v3_config_has_a_key_value_head_per_query_head() -> None:
    """DeepSeek-V3's multi-head latent attention expands its keys and values to every query head itself (real
    checkpoints: 128 and 128). With fewer key/value heads in the config, transformers' SDPA repeats the expanded
    heads again: eager PyTorch fails as soon as an attention mask is materialised (a padded batch), and
    torch.export (which always materialises it) fails on the suite's own sample."""
    model, (_args, kwargs) = transformers_models.build("deepseek_v3")
    config = model.config
    assert config.num_key_value_heads == config.num_attention_heads
    ids = kwargs["input_ids"]
    padded = torch.ones_like(ids)
    padded[0, 0] = 0  # a left-padded row: the mask is materialised in eager PyTorch too
    with torch.no_grad():
        model(input_ids=ids, attention_mask=padded)
        program = torch.export.export(model, (), kwargs, strict=False)
        exported = program.module()(**kwargs).last_hidden_state
        torch.testing.assert_close(exported, model(**kwargs).last_hidden_state)
