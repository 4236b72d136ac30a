"""Vision-language models whose images are placed otherwise than at an image token id, judged against transformers'
own ``model.generate`` on a tiny random model: Kosmos-2, whose processor marks the image tokens with a per-token input
(``image_embeds_position_mask``), whose ``generate`` hands its text model no positions (it counts them from its
padding token's id) and whose text model builds its own additive mask over past and new keys. Greedy and beam-search
sequences token-identical on a left-padded batch of 2, every greedy step's scores within 1e-3, a saved and loaded
directory, and TensorRT-RTX's real builder on both graphs. Nothing is downloaded: the model is built from its
config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import tiny_models
import torch
import transformers
from tiny_models import transformers_generate

import pipeline
from converters.errors import InputError
from pipeline.runtime.generation.vision_language import VisionLanguageModule

GENERATION = {"max_length": 40, "max_batch": 8}
LATENTS = 8  # image tokens per image
PAD = 1  # Kosmos-2's padding token: its positions count from it


def kosmos2() -> Any:
    text = {
        "vocab_size": 128,
        "embed_dim": 32,
        "layers": 2,
        "ffn_dim": 64,
        "attention_heads": 2,
        "max_position_embeddings": 64,
        "pad_token_id": PAD,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    config = transformers.Kosmos2Config(text_config=text, vision_config=vision, latent_query_num=LATENTS)
    return tiny_models.lively(
        lambda: transformers.Kosmos2ForConditionalGeneration(config), seed=0, std=0.3, keep_eos=False
    )


def placed_prompts() -> dict[str, torch.Tensor]:
    """Two prompts, one image each, marked by ``image_embeds_position_mask``: the second left-padded by 2 (with the
    padding token), its image one place later."""
    ids = torch.randint(3, 100, (2, LATENTS + 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    marked = torch.zeros_like(ids, dtype=torch.bool)
    marked[0, 2 : 2 + LATENTS] = True
    mask[1, :2] = 0
    ids[1, :2] = PAD
    marked[1, 3 : 3 + LATENTS] = True
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": mask, "image_embeds_position_mask": marked, "pixel_values": images}


@pytest.fixture(scope="module")
def model() -> Any:
    return kosmos2()


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    return placed_prompts()


@pytest.fixture(scope="module")
def module(model: Any, inputs: dict[str, torch.Tensor]) -> VisionLanguageModule:
    # validated: each graph against PyTorch, then the sample's greedy tokens against model.generate
    converted = pipeline.convert(model, inputs, generation=GENERATION)
    assert isinstance(converted, VisionLanguageModule)
    return converted


def test_kosmos2_greedy_beams_and_scores_equal_transformers(
    model: Any, module: VisionLanguageModule, inputs: dict[str, torch.Tensor]
) -> None:
    assert module.placement == "image_embeds_position_mask" and module.image_token_id is None
    greedy = transformers_generate(model, inputs, max_new_tokens=12)
    assert len(set(greedy[:, inputs["input_ids"].shape[1] :].flatten().tolist())) >= 4  # not one token repeated
    assert torch.equal(module.generate(**inputs, max_new_tokens=12), greedy)
    scored: dict[str, Any] = {"max_new_tokens": 12, "output_scores": True, "return_dict_in_generate": True}
    expected: Any = transformers_generate(model, inputs, **scored)
    ours: Any = module.generate(**inputs, **scored)
    for theirs, mine in zip(expected.scores, ours.scores, strict=True):
        assert (theirs - mine).abs().max() < 1e-3
    beams = transformers_generate(model, inputs, max_new_tokens=6, num_beams=4, num_return_sequences=2)
    assert torch.equal(module.generate(**inputs, max_new_tokens=6, num_beams=4, num_return_sequences=2), beams)


def test_a_saved_directory_loads_and_generates_the_same(
    module: VisionLanguageModule, inputs: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    loaded = pipeline.load(module.save(tmp_path / "kosmos-2"))
    assert isinstance(loaded, VisionLanguageModule) and loaded.placement == module.placement
    assert torch.equal(loaded.generate(**inputs, max_new_tokens=6), module.generate(**inputs, max_new_tokens=6))


def test_the_marks_are_asked_for_and_counted(module: VisionLanguageModule, inputs: dict[str, torch.Tensor]) -> None:
    unmarked = {name: value for name, value in inputs.items() if name != "image_embeds_position_mask"}
    with pytest.raises(InputError, match="image_embeds_position_mask"):
        module.generate(**unmarked, max_new_tokens=2)
    fewer = inputs["image_embeds_position_mask"].clone()
    fewer[0, 2] = False
    with pytest.raises(InputError, match="features"):
        module.generate(**{**inputs, "image_embeds_position_mask": fewer}, max_new_tokens=2)


def test_tensorrt_rtx_builds_both_kosmos2_graphs(model: Any, inputs: dict[str, torch.Tensor]) -> None:
    pytest.importorskip("tensorrt_rtx")
    module = pipeline.convert(model, inputs, generation=GENERATION, backend="tensorrt-rtx", validate=False)
    assert isinstance(module, VisionLanguageModule)
    assert module.vision.engine_bytes and module.step.engine_bytes
