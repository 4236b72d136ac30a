"""A tiny Llama with random weights (transformers; nothing is downloaded), for the generation examples.

``pipeline convert examples/tiny_llama.py:build --generation max_length=64 -o out/llama`` converts it as one cached
decoder step; ``build`` returns ``(model, input_ids)``.
"""

from __future__ import annotations

import torch


def build() -> tuple[torch.nn.Module, torch.Tensor]:
    """The model (2 layers, width 32, vocabulary 128, grouped KV heads) and a sample prompt of 6 tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval(), torch.randint(0, 128, (1, 6))
