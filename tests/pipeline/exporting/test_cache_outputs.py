"""A transformers cache object among a plain conversion's outputs (T5Gemma's ``EncoderDecoderCache``, LLaVA's
``DynamicCache``) is dropped: the model converts, the module returns None in its place, and the report names it.
Tiny models with random weights, built from their configs (nothing downloaded)."""

from __future__ import annotations

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers

import pipeline
from pipeline.exporting.cache_outputs import forward_without_cache

TEXT = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 64}


def ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 100, (1, length), generator=torch.Generator().manual_seed(seed))


def test_t5gemma_converts_without_its_encoder_decoder_cache() -> None:
    """T5Gemma's ``use_cache`` is in its decoder's sub-config only; the call is made with ``use_cache=False``."""
    half = transformers.T5GemmaModuleConfig(**TEXT, **HEADS, query_pre_attn_scalar=16, sliding_window=8)
    config = transformers.T5GemmaConfig(encoder=half, decoder=half, vocab_size=128)
    model = transformers.T5GemmaModel(config).eval()
    sample = {"input_ids": ids(8), "decoder_input_ids": ids(4, seed=1)}
    assert isinstance(model(**sample).cache, transformers.EncoderDecoderCache)  # what the plain export refused

    module = pipeline.convert(model, ((), sample), validation_inputs=1)

    assert module.report.dropped_outputs == {"result.cache": "EncoderDecoderCache"}
    assert "dropped   result.cache (EncoderDecoderCache): the model's key/value cache" in module.report.summary()
    assert module.report.accuracy is not None and module.report.accuracy.passed
    out = module(**sample)
    assert out.cache is None
    with torch.no_grad():
        want = model(**sample)
    torch.testing.assert_close(out.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.encoder_last_hidden_state, want.encoder_last_hidden_state, rtol=1e-4, atol=1e-5)


def test_llava_converts_without_its_language_models_dynamic_cache() -> None:
    """LLaVA's forward takes no ``use_cache`` (its language model reads the text config's): the cache the traced
    call builds is dropped from its result."""
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    text = transformers.LlamaConfig(**TEXT, **HEADS)
    config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_id=127, image_seq_length=16)
    model = transformers.LlavaModel(config).eval()
    tokens = ids(20)
    tokens[0, 2:18] = 127  # the 16 image tokens
    sample = {"input_ids": tokens, "pixel_values": torch.randn(1, 3, 32, 32)}

    module = pipeline.convert(model, ((), sample), validation_inputs=1)

    assert module.report.dropped_outputs == {"result.cache": "DynamicCache"}
    out = module(**sample)
    assert out.cache is None
    with torch.no_grad():
        want = model(**sample)
    torch.testing.assert_close(out.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-5)


def test_a_model_that_computes_otherwise_without_its_cache_is_exported_as_called() -> None:
    """FSMT applies its causal mask only when ``use_cache`` is off: asking for ``use_cache=False`` would change the
    outputs, so the forward the export traces keeps the call as made and only drops the cache."""
    config = transformers.FSMTConfig(
        src_vocab_size=128, tgt_vocab_size=128, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=64, langs=["en", "de"],
    )  # fmt: skip
    model = transformers.FSMTModel(config).eval()
    sample = {"input_ids": ids(8), "decoder_input_ids": ids(4, seed=1)}
    with torch.no_grad():
        want = model(**sample)
        assert not torch.equal(model(**sample, use_cache=False).last_hidden_state, want.last_hidden_state)
        with forward_without_cache(model, want, (), sample) as dropped:
            got = model(**sample)
    assert dropped == {"result.cache": "EncoderDecoderCache"}
    assert got.cache is None
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=0)
    assert "forward" not in vars(model)  # the class's forward again
