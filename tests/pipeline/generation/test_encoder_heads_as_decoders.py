"""Causal-LM heads over encoder stacks (BERT's family: ``BertLMHeadModel``, ``MegatronBertForCausalLM``, ...):
transformers caches their keys and values only when the config says ``is_decoder=True`` (and asks users for it).
Built so, they convert for generation and decode as ``model.generate``, also the ones that make an encoder-decoder
cache whatever they are called with (MegatronBERT: its self-attention half is the step's cache); built as encoders,
the refusal names ``is_decoder=True``. Tiny models, fp32, ONNX Runtime, a left-padded batch."""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny_models import decodes_as_transformers, drawn_by_fan_in, left_padded

import pipeline
from converters.errors import InputError

GENERATION = {"max_length": 24, "max_batch": 8}
GREEDY = {"max_new_tokens": 6}
SIZES = {"vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
SIZES |= {"intermediate_size": 64, "max_position_embeddings": 64, "pad_token_id": 0}


def _inputs() -> dict[str, torch.Tensor]:
    ids, mask = left_padded([7, 5], seed=3)
    return {"input_ids": ids, "attention_mask": mask}


def test_a_megatron_bert_decoder_decodes_as_transformers() -> None:
    """MegatronBERT makes an EncoderDecoderCache even as a decoder (its cross-attention half empty): the step holds
    its self-attention half, and the model's layers use the step's plain cache as it is."""
    torch.manual_seed(0)
    config = transformers.MegatronBertConfig(is_decoder=True, **SIZES)
    model = drawn_by_fan_in(transformers.MegatronBertForCausalLM(config))
    with torch.no_grad():
        cache = model(**_inputs(), use_cache=True).past_key_values
    assert isinstance(cache, transformers.EncoderDecoderCache)  # what the step's layout is read from
    module = pipeline.convert(model, _inputs(), generation=GENERATION)
    decodes_as_transformers(model, module, _inputs(), **GREEDY)


def test_an_encoder_config_is_refused_naming_is_decoder() -> None:
    """Built as an encoder (``is_decoder=False``), BERT's causal-LM head caches nothing: refused, the fix naming
    ``is_decoder=True``."""
    torch.manual_seed(0)
    model = transformers.BertLMHeadModel(transformers.BertConfig(is_decoder=False, **SIZES)).eval()
    with pytest.raises(InputError, match=r"is_decoder=False") as refused:
        pipeline.convert(model, _inputs(), generation=GENERATION)
    assert "from_pretrained(..., is_decoder=True)" in str(refused.value)
