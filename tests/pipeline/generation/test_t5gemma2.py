"""T5Gemma 2 with an image (``convert(..., generation=...)``): an encoder-decoder whose encoder places its image's
features at the prompt's image tokens, then attends over a bidirectional sliding window that transformers builds
with ``torch.vmap`` (a mask function handed to ``create_bidirectional_mask``), which the export broadcasts instead
(:mod:`pipeline.exporting.index_masks`). A tiny random model whose window is narrower than the prompt, a right-padded
batch of two prompts with an image each: greedy tokens and every step's scores (1e-3) and 4-beam sequences as
``model.generate`` gives them; another image gives other tokens."""

from __future__ import annotations

from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
import transformers
from tiny_models import converted_for_rtx_when_it_imports, decodes_as_transformers, lively

from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule

IMAGE_TOKEN, END_OF_IMAGE = 95, 94
#: a 16 x 16 image in 8 x 8 patches: 4 features
IMAGE_TOKENS = 4
GREEDY: dict[str, Any] = {"max_new_tokens": 6}


@pytest.fixture(scope="module")
def t5gemma2() -> transformers.T5Gemma2ForConditionalGeneration:
    text = {
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "max_position_embeddings": 64,
        "sliding_window": 4,  # the encoder sees 2 tokens back and 2 ahead: narrower than the prompt
        "layer_types": ["sliding_attention"],
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 16,
        "patch_size": 8,
    }
    encoder = transformers.T5Gemma2EncoderConfig(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=IMAGE_TOKENS,
        image_token_index=IMAGE_TOKEN,
        eoi_token_index=END_OF_IMAGE,
    )
    config = transformers.T5Gemma2Config(
        encoder=encoder,
        decoder=text,
        image_token_index=IMAGE_TOKEN,
        eoi_token_index=END_OF_IMAGE,
        tie_word_embeddings=False,  # tied, the decoder's input token would dominate its own logits
    )
    model = transformers.T5Gemma2ForConditionalGeneration
    return lively(lambda: model(config), seed=0, std=0.3, keep_eos=False)


def prompts(seed: int) -> dict[str, torch.Tensor]:
    """Two prompts (the image's tokens, its end, then text), the first right-padded by two, and an image each."""
    generator = torch.Generator().manual_seed(seed)
    text = torch.randint(3, END_OF_IMAGE, (2, 7), generator=generator)
    image = torch.tensor([[IMAGE_TOKEN] * IMAGE_TOKENS + [END_OF_IMAGE]] * 2)
    ids = torch.cat([image, text], dim=1)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0
    pixels = torch.randn(2, 3, 16, 16, generator=generator)
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "pixel_values": pixels}


@pytest.fixture(scope="module")
def module(t5gemma2: Any) -> EncoderDecoderModule:
    # not validated here: the tests compare it with the model themselves; TensorRT-RTX's real builder builds both
    # graphs (the encoder's mask broadcast from its mask function) when it imports, the graphs run on ONNX Runtime
    converted = converted_for_rtx_when_it_imports(t5gemma2, prompts(1), {"max_length": 12, "max_batch": 8})
    assert isinstance(converted, EncoderDecoderModule)
    return converted


def test_tensorrt_rtx_builds_both_graphs(module: EncoderDecoderModule) -> None:
    pytest.importorskip("tensorrt_rtx")
    assert module.encoder.engine_bytes and module.decoder.engine_bytes


def test_decodes_as_transformers(t5gemma2: Any, module: EncoderDecoderModule) -> None:
    expected, _ = decodes_as_transformers(t5gemma2, module, prompts(1), **GREEDY)
    assert len(set(expected[:, 1:].flatten().tolist())) >= 4, expected  # worth comparing


def test_another_image_gives_other_tokens(t5gemma2: Any, module: EncoderDecoderModule) -> None:
    """The image reaches the encoder graph: other images decode otherwise, as the model does."""
    other = {**prompts(1), "pixel_values": prompts(2)["pixel_values"] * 3}
    ours = module.generate(**other, **GREEDY)
    assert not torch.equal(ours, module.generate(**prompts(1), **GREEDY))
    with torch.no_grad():
        assert torch.equal(ours, t5gemma2.generate(**other, **GREEDY, do_sample=False))
