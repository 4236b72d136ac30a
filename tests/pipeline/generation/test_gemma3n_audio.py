"""Gemma 3n's audio: its forward hands ``get_audio_features`` the inverse of the processor's frame mask
(``~input_features_mask``), writes a padding embedding over the rows of the frames it drops, and embeds its ids by
more than its input embedding (ids past its text vocabulary by its audio and vision tables, per-layer inputs read by
id). The conversion calls the method as the forward does (the mask inverted: seen on the sample's forward), places
the features in the embeddings the forward hands its language model (the step hands the model its ids), and checks
that the features it places are the rows the forward places (:mod:`pipeline.generation.placement_check`). A tiny
Gemma 3n (2 text layers, 2 conformer layers, a 0.1-wide vision tower never run) decodes a left-padded batch of two
audios as ``model.generate`` does; a sample whose audio drops frames (rows the forward writes over) is refused, naming
the positions. Nothing is downloaded."""

from __future__ import annotations

from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import decodes_its_audio_as_transformers

import pipeline
from converters.errors import InputError
from pipeline.runtime.generation.vision_language import VisionLanguageModule

GENERATION = {"max_length": 24, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 6, "do_sample": False}
AUDIO_TOKEN, COUNT, FRAMES, MELS = 257, 2, 32, 16  # 32 frames: 2 audio tokens (strides 2, 2 and a reduction of 4)


def tiny_gemma3n() -> Any:
    """A tiny Gemma 3n whose vision tokens start at 128, its audio tokens at 256 (of 384), 2 audio tokens per audio."""
    torch.manual_seed(0)
    text = transformers.Gemma3nTextConfig(
        vocab_size=384,
        vocab_size_per_layer_input=384,
        hidden_size=32,
        hidden_size_per_layer_input=8,
        intermediate_size=[64, 64],
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_kv_shared_layers=1,
        layer_types=["sliding_attention", "sliding_attention"],
        activation_sparsity_pattern=[0.0, 0.0],
        laurel_rank=8,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=1,
    )
    audio = transformers.Gemma3nAudioConfig(
        vocab_offset=256,
        input_feat_size=MELS,
        hidden_size=32,
        conf_num_hidden_layers=2,
        conf_num_attention_heads=2,
        sscp_conv_channel_size=[8, 8],
    )
    vision = transformers.Gemma3nVisionConfig(vocab_offset=128, hidden_size=32, model_args={"channel_multiplier": 0.1})
    config = transformers.Gemma3nConfig(
        text_config=text,
        audio_config=audio,
        vision_config=vision,
        image_token_id=129,
        audio_token_id=AUDIO_TOKEN,
        audio_soft_tokens_per_image=COUNT,
    )
    model = transformers.Gemma3nForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = None  # every new token decoded
    return model


def prompts_and_audio(mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Two prompts (the first left-padded by 2) with their audio's 2 tokens each, two audios of 32 frames."""
    ids = torch.randint(3, 100, (2, 8 + COUNT), generator=torch.Generator().manual_seed(1))
    ids[:, 3 : 3 + COUNT] = AUDIO_TOKEN
    attention = torch.ones_like(ids)
    ids[0, :2], attention[0, :2] = 0, 0
    features = torch.randn(2, FRAMES, MELS, generator=torch.Generator().manual_seed(2))
    frames = torch.ones(2, FRAMES, dtype=torch.bool) if mask is None else mask
    return {"input_ids": ids, "attention_mask": attention, "input_features": features, "input_features_mask": frames}


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_gemma3n()


def test_decodes_its_audio_as_transformers(model: Any) -> None:
    inputs = prompts_and_audio()
    module = pipeline.convert(model, inputs, generation=GENERATION, validate=False)
    assert isinstance(module, VisionLanguageModule) and module.modality == "audio"
    decodes_its_audio_as_transformers(model, module, inputs, **GREEDY)


def test_an_audio_whose_placed_rows_differ_is_refused(model: Any) -> None:
    mask = torch.ones(2, FRAMES, dtype=torch.bool)
    mask[1, FRAMES // 2 :] = False  # the second audio's last token: the forward writes its padding row there
    with pytest.raises(InputError, match=r"places other rows at the sample's audio tokens \(257\).* \(1, 4\)") as error:
        pipeline.convert(model, prompts_and_audio(mask), generation=GENERATION, validate=False)
    assert "at 1 of 4 positions" in str(error.value) and error.value.fix
