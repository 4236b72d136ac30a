"""Florence-2 (``convert(..., generation=...)``): an encoder-decoder whose ``generate`` prepares its encoder's input
itself, the image features merged into the prompt's embeddings at its image tokens before the text encoder. The
encoder graph is that preparation (``get_encoder()`` alone never sees the image). A tiny random model, a
right-padded batch of two prompts with an image each: greedy and 4-beam sequences token-identical to
``model.generate``, every greedy step's scores within 1e-3, and another image gives other tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from tiny_models import lively

import pipeline
from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule

IMAGE_TOKEN = 95
#: an 8x8 image through one stage of stride 4: 2x2 patches and their mean, 5 features
IMAGE_TOKENS = 5
GREEDY: dict[str, Any] = {"max_new_tokens": 8, "do_sample": False}


@pytest.fixture(scope="module")
def florence() -> transformers.Florence2ForConditionalGeneration:
    text = {
        "model_type": "bart",
        "vocab_size": 96,
        "d_model": 32,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 48,
        "decoder_ffn_dim": 48,
        "max_position_embeddings": 64,
        "forced_eos_token_id": None,
    }
    vision = {  # one stage (the export's time grows with each)
        "depths": [1],
        "embed_dim": [16],
        "num_heads": [2],
        "num_groups": [2],
        "patch_size": [7],
        "patch_stride": [4],
        "patch_padding": [3],
        "patch_prenorm": [False],
        "window_size": 2,
        "drop_path_rate": 0.0,
        "projection_dim": 32,
        "max_position_embeddings": 8,
        "max_temporal_embeddings": 4,
    }
    config = transformers.Florence2Config(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN)
    return lively(lambda: transformers.Florence2ForConditionalGeneration(config), seed=0, std=0.4, keep_eos=False)


@pytest.fixture(scope="module")
def prompts() -> dict[str, torch.Tensor]:
    """Two prompts (the image's tokens first, as Florence-2's processor puts them), the second right-padded, and an
    image each."""
    generator = torch.Generator().manual_seed(1)
    text = torch.randint(4, IMAGE_TOKEN, (2, 6), generator=generator)
    ids = torch.cat([torch.full((2, IMAGE_TOKENS), IMAGE_TOKEN), text], dim=1)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    pixels = torch.randn(2, 3, 8, 8, generator=generator)
    return {"input_ids": ids.masked_fill(mask == 0, 1), "attention_mask": mask, "pixel_values": pixels}


@pytest.fixture(scope="module")
def module(florence: Any, prompts: dict[str, torch.Tensor]) -> EncoderDecoderModule:
    # not validated here: the tests compare it with the model themselves
    converted = pipeline.convert(florence, prompts, generation={"max_length": 16, "max_batch": 8}, validate=False)
    assert isinstance(converted, EncoderDecoderModule)
    return converted


def test_encoder_graph_takes_the_image(module: EncoderDecoderModule) -> None:
    assert [spec.name for spec in module.encoder.io.inputs] == ["input_ids", "pixel_values", "attention_mask"]


def test_greedy_sequences_and_scores_equal_transformers(
    florence: Any, module: EncoderDecoderModule, prompts: dict[str, torch.Tensor]
) -> None:
    options = {**GREEDY, "return_dict_in_generate": True, "output_scores": True}
    with torch.no_grad():
        theirs = florence.generate(**prompts, **options)
    ours: Any = module.generate(**prompts, **options)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert len(set(ours.sequences[:, 1:].flatten().tolist())) >= 4, ours.sequences  # worth comparing
    for mine, reference in zip(ours.scores, theirs.scores, strict=True):
        scale = float(reference.abs().max())  # 1e-3 of the step's score range
        torch.testing.assert_close(mine, reference, rtol=1e-3, atol=1e-3 * max(scale, 1.0))


def test_beam_search_equals_transformers(
    florence: Any, module: EncoderDecoderModule, prompts: dict[str, torch.Tensor]
) -> None:
    with torch.no_grad():
        theirs = florence.generate(**prompts, **GREEDY, num_beams=4)
    assert torch.equal(module.generate(**prompts, **GREEDY, num_beams=4), theirs)


def test_another_image_gives_other_tokens(
    florence: Any, module: EncoderDecoderModule, prompts: dict[str, torch.Tensor]
) -> None:
    """The image reaches the encoder graph: the same prompts with other images decode otherwise, as the model does."""
    other = {**prompts, "pixel_values": torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(7)) * 3}
    ours = module.generate(**other, **GREEDY)
    assert not torch.equal(ours, module.generate(**prompts, **GREEDY))
    with torch.no_grad():
        assert torch.equal(ours, florence.generate(**other, **GREEDY))
