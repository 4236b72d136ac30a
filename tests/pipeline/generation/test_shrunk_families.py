"""Image-text-to-text types the every-type source (``tests/model_sources/transformers_all_models.py``) builds since its
shrink takes the repairs a config's own validation asks for (``tests/model_sources/config_repairs.py``) and its sample
search lays out the images their towers take; one of them converted and decoded as transformers does.

Nothing is downloaded; every model is random weights from transformers' own config classes."""

from __future__ import annotations

from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
from model_sources import config_repairs
from model_sources import transformers_all_models as every

import pipeline

GREEDY: dict[str, Any] = {"max_new_tokens": 6, "do_sample": False}


def test_two_named_fields_that_must_match_are_set_in_the_sub_config_the_message_names() -> None:
    """Inkling 2 Loop: "`vision_config.text_hidden_size` (2304) must match `text_config.hidden_size` (32)" sets the
    tower's projection width to the shrunk text width; Nemotron-H Omni: "`vision_config.video_temporal_patch_size`
    (None) and `video_temporal_patch_size` (2) must be equal" builds the tower again with 2, so that the width it
    derives from it (``video_patch_dim``) is derived too."""
    inkling = every.shrunk("inkling2_loop")
    assert inkling.vision_config.text_hidden_size == inkling.text_config.hidden_size == 32
    nemotron = every.shrunk("nemotron_h_omni")
    assert nemotron.vision_config.video_temporal_patch_size == nemotron.video_temporal_patch_size == 2
    assert nemotron.vision_config.video_patch_dim == 2 * nemotron.vision_config.patch_dim


def test_per_layer_lists_are_cut_and_a_vocabulary_stated_apart_kept_within_the_vocabulary() -> None:
    """Muse Spark's audio tower: "`patch_sizes`, `hidden_sizes` and `depths` must have one entry per layer, got 4, 4
    and 4 for `num_hidden_layers`=2" cuts each to its first 2; Inkling 2's head (``unpadded_vocab_size``, 200058 of
    the default 200064) is kept within the shrunk vocabulary, else a generated id is past the embedding."""
    audio = every.shrunk("muse_spark").audio_config
    assert len(audio.patch_sizes) == len(audio.hidden_sizes) == len(audio.depths) == audio.num_hidden_layers == 2
    assert list(audio.hidden_sizes) == [256, 512]  # the class's first two stages
    text = every.shrunk("inkling2").text_config
    assert text.unpadded_vocab_size == text.vocab_size == 128


def test_a_message_asking_for_nothing_known_is_no_repair() -> None:
    class Sized:
        def __init__(self, width: int = 8, tower_width: int = 8) -> None: ...

    assert config_repairs.repaired("hidden_size must be divisible by num_attention_heads", Sized, {}) is None
    repaired = config_repairs.repaired("`tower_width` (2304) must match `width` (32).", Sized, {"width": 32})
    assert repaired == {"width": 32, "tower_width": 32}
    # asked again of arguments that already hold it: nothing left to repair
    assert config_repairs.repaired("`tower_width` (2304) must match `width` (32).", Sized, repaired) is None


@pytest.mark.parametrize(
    ("kind", "inputs"),
    [
        # a grid of merged tokens, each token's pixels [tokens, 16, 16, 3], channels last
        ("inkling2", {"input_ids", "attention_mask", "pixel_values", "image_grid_thw"}),
        # flattened patches of 2 frames; the projector's input width repaired from the tower's error
        ("muse_glimmer", {"input_ids", "attention_mask", "pixel_values", "image_grid_thw"}),
    ],
)
def test_the_image_sample_is_found_for_towers_that_take_their_own_layout(kind: str, inputs: set[str]) -> None:
    model, (_args, sample) = every.build(kind, every.model_classes(kind)[-1][1])
    assert set(sample) == inputs
    token = model.config.image_token_id
    assert int((sample["input_ids"] == token).sum()) > 0  # placeholders, one per feature the tower made
    with torch.no_grad():
        model(**sample)


def test_step3p7_converts_and_decodes_as_transformers_does() -> None:
    """Step 3.7's text model builds a sliding-window mask whatever its layers are, from a window only a checkpoint
    sets: the source gives it one as wide as the positions (its error asks for it), then the model converts and its
    greedy tokens on a left-padded batch of two equal ``model.generate``'s."""
    model, (_args, sample) = every.build("step3p7", "Step3p7ForConditionalGeneration")
    assert model.config.text_config.sliding_window == model.config.text_config.max_position_embeddings
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0, 1.5 / parameter.shape[-1] ** 0.5, generator=generator)
    model.generation_config.eos_token_id = None
    ids, pixels = sample["input_ids"], sample["pixel_values"]
    pad = torch.zeros(1, 2, dtype=ids.dtype)
    batch = {  # the prompt left-padded by 2, and a copy with 2 more text tokens and another image
        "input_ids": torch.cat([torch.cat([pad, ids], 1), torch.cat([ids[:, -2:], ids], 1)]),
        "attention_mask": torch.cat([torch.cat([pad, torch.ones_like(ids)], 1), torch.ones(1, ids.shape[1] + 2)]),
        "pixel_values": torch.cat([pixels, torch.randn(pixels.shape, generator=generator)]),
    }
    batch["attention_mask"] = batch["attention_mask"].to(torch.int64)
    with torch.no_grad():
        expected = model.generate(**batch, **GREEDY)
    module = pipeline.convert(model, batch, generation={"max_length": 32, "max_batch": 2}, validate=False)
    assert torch.equal(module.generate(**batch, **GREEDY), expected)
    assert len(set(expected[:, ids.shape[1] + 2 :].flatten().tolist())) > 1  # the tokens vary
