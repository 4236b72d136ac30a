"""Decoders whose text cross-attends to their images (``convert(model, {"input_ids", "attention_mask",
"pixel_values", ...}, generation=...)``): Mllama (cross-attention layers caching the projected image keys and values)
and IDEFICS (gated cross-attention given the image states at every step, through a perceiver), judged against
transformers' own ``model.generate`` on tiny random models. Greedy and beam-search sequences token-identical on a
left-padded batch of 2 whose image masks have fewer rows than tokens and rows that see no image, every greedy step's
scores, a saved and loaded directory, the errors a caller meets, and TensorRT-RTX's real builder on both graphs.
Nothing is downloaded: the models are built from their configs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import tiny_models
import torch
import transformers
from model_sources.transformers_all_models import open_gates
from tiny_models import transformers_generate

import pipeline
from converters.errors import InputError
from pipeline.runtime.generation.cross_images import CrossImagesModule, per_token_rows
from pipeline.runtime.generation.encoder_decoder import DECODER_FILE, ENCODER_FILE

GENERATION = {"max_length": 32, "max_batch": 8}
TOKENS = 10  # each prompt's tokens; the second prompt left-padded by 2


def lively(make: Any, seed: int) -> Any:
    """:func:`tiny_models.lively` without an end-of-sequence token, the tanh gates on the images opened (transformers
    starts them closed, which shuts the images out of the logits)."""
    model = tiny_models.lively(make, seed, 0.3, keep_eos=False)
    open_gates(model)
    return model


def text(seed: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (2, TOKENS), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 0
    return {"input_ids": ids, "attention_mask": mask}


def seen(rows: int, *layout: int) -> torch.Tensor:
    """Which images (and tiles) each token sees: the first 3 tokens none, then the first tile (or image); ``rows`` per
    prompt (fewer than its tokens: generate repeats the last row)."""
    mask = torch.zeros(2, rows, *layout, dtype=torch.int64)
    mask[:, 3:, ..., 0] = 1
    return mask


def mllama_model() -> Any:
    vision = transformers.MllamaVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_global_layers=1,
        attention_heads=2,
        image_size=16,
        patch_size=8,
        max_num_tiles=2,
        intermediate_layers_indices=[0],
        vision_output_dim=32,
        supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]],
    )
    text_config = transformers.MllamaTextConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped: the image mask's one head is each query head's bias
        cross_attention_layers=[1],
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    config = transformers.MllamaConfig(vision_config=vision, text_config=text_config, image_token_index=127)
    return lively(lambda: transformers.MllamaForConditionalGeneration(config), seed=0)


def mllama_inputs() -> dict[str, torch.Tensor]:
    """Two prompts of one image of 2 tiles each (the second's one tile and padding), their masks 8 rows long."""
    tiles = torch.tensor([[[1, 1]], [[1, 0]]])
    return {
        **text(),
        "pixel_values": torch.randn(2, 1, 2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),
        "aspect_ratio_ids": torch.tensor([[2], [1]]),
        "aspect_ratio_mask": tiles,
        "cross_attention_mask": seen(TOKENS - 2, 1, 2) * tiles[:, None],
    }


def idefics_model() -> Any:
    config = transformers.IdeficsConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        cross_layer_interval=1,
        use_resampler=True,
        vision_config={
            "embed_dim": 16,
            "image_size": 16,
            "intermediate_size": 32,
            "patch_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
        },
        perceiver_config={
            "use_resampler": True,
            "resampler_n_latents": 4,
            "resampler_depth": 1,
            "resampler_n_heads": 2,
            "resampler_head_dim": 8,
        },
    )
    return lively(lambda: transformers.IdeficsForVisionText2Text(config), seed=1)


def idefics_inputs() -> dict[str, torch.Tensor]:
    """Two prompts of two images each (the first seen from the 4th token, the second from the 7th), their masks 8 rows
    long."""
    images = torch.randn(2, 2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    mask = seen(TOKENS - 2, 2)
    mask[:, 6:, 1] = 1
    return {**text(1), "pixel_values": images, "image_attention_mask": mask}


@pytest.fixture(scope="module")
def mllama() -> tuple[Any, dict[str, torch.Tensor], CrossImagesModule]:
    model, inputs = mllama_model(), mllama_inputs()
    module = pipeline.convert(model, inputs, generation=GENERATION)  # validated: greedy and every step's logits
    assert isinstance(module, CrossImagesModule)
    return model, inputs, module


def test_mllama_generates_as_transformers_does(mllama: tuple[Any, dict[str, torch.Tensor], Any]) -> None:
    """Greedy and 3 beams (2 sequences each) token-identical to ``model.generate``; every greedy step's scores
    within 1e-3. The image graph gives the cross-attention layer's keys and values (the cache layer that does not grow
    with a new token); the masks' rows are padded with their last row, as generate pads them."""
    model, inputs, module = mllama
    assert module.generation.layers == 2  # the two self-attention layers; the cross layer is given
    assert {spec.name for spec in module.encoder.io.outputs} == {"cross.0.key", "cross.0.value"}
    assert torch.equal(
        module.generate(**inputs, max_new_tokens=8), transformers_generate(model, inputs, max_new_tokens=8)
    )
    beams: dict[str, Any] = {"max_new_tokens": 6, "num_beams": 3, "num_return_sequences": 2}
    assert torch.equal(module.generate(**inputs, **beams), transformers_generate(model, inputs, **beams))
    scored: dict[str, Any] = {"max_new_tokens": 6, "output_scores": True, "return_dict_in_generate": True}
    ours, theirs = module.generate(**inputs, **scored), transformers_generate(model, inputs, **scored)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert max(float((a - b).abs().max()) for a, b in zip(ours.scores, theirs.scores, strict=True)) < 1e-3
    assert module.report.accuracy.decoding is not None  # the conversion judged every step's logits


def test_requests_hold_request_slots(mllama: tuple[Any, dict[str, torch.Tensor], Any]) -> None:
    """The image graph and the step from several threads, bounded by the module's request slots, every answer as
    alone (tiny_models.requests_wait_for_slots)."""
    _, inputs, module = mllama
    tiny_models.requests_wait_for_slots(module, inputs)


def test_a_mask_row_that_sees_no_image_and_one_row_per_token(
    mllama: tuple[Any, dict[str, torch.Tensor], Any],
) -> None:
    """Masks with a row per token, and the second prompt seeing no image at all (every row masked: transformers
    zeroes the cross-attention layer's MLP there), as ``model.generate``."""
    model, inputs, module = mllama
    full = per_token_rows(inputs["cross_attention_mask"], TOKENS).clone()
    full[1] = 0
    given = {**inputs, "cross_attention_mask": full}
    assert torch.equal(
        module.generate(**given, max_new_tokens=6), transformers_generate(model, given, max_new_tokens=6)
    )
    one = {name: value[1:] for name, value in inputs.items()}  # one prompt: a batch other than the sample's
    assert torch.equal(module.generate(**one, max_new_tokens=6), transformers_generate(model, one, max_new_tokens=6))


def test_the_saved_directory_loads_as_the_same_module(
    mllama: tuple[Any, dict[str, torch.Tensor], Any], tmp_path: Path
) -> None:
    """An encoder-decoder directory (the image graph and the step); loading it picks the cross-attended kind from the
    step's inputs."""
    _model, inputs, module = mllama
    expected = module.generate(**inputs, max_new_tokens=6)
    module.save(tmp_path / "mllama")
    assert {p.name for p in (tmp_path / "mllama").iterdir()} == {ENCODER_FILE, DECODER_FILE}
    loaded = pipeline.load(tmp_path / "mllama")
    assert isinstance(loaded, CrossImagesModule)
    assert torch.equal(loaded.generate(**inputs, max_new_tokens=6), expected)
    streamed = torch.stack(list(loaded.stream(**inputs, max_new_tokens=6)), dim=1)
    assert torch.equal(streamed, expected[:, TOKENS:])


def test_the_errors_a_caller_meets(mllama: tuple[Any, dict[str, torch.Tensor], Any]) -> None:
    _model, inputs, module = mllama
    without = {name: value for name, value in inputs.items() if name != "aspect_ratio_ids"}
    with pytest.raises(InputError, match="needs the image inputs aspect_ratio_ids"):
        module.generate(**without, max_new_tokens=2)
    two_images = {**inputs, "pixel_values": inputs["pixel_values"].repeat(1, 2, 1, 1, 1, 1)}
    with pytest.raises(InputError, match="pixel_values is .* but the image graph takes") as caught:
        module.generate(**two_images, max_new_tokens=2)
    assert "convert with a sample of this layout" in str(caught.value)
    with pytest.raises(InputError, match="cross_attention_mask is"):
        module.generate(**{**inputs, "cross_attention_mask": inputs["cross_attention_mask"][0]}, max_new_tokens=2)
    with pytest.raises(InputError, match="max_batch=8"):
        module.generate(**inputs, max_new_tokens=2, num_beams=5)


def test_the_decomposed_attention_broadcasts_the_image_masks_one_head_over_grouped_heads() -> None:
    """The attention TensorRT gets (decomposed: the query heads folded over the key-value heads) with the image mask's
    one head for all 4 query heads over 2 key-value heads: it broadcasts (reshaping it by the key-value heads
    failed), the real TensorRT-RTX builder builds both graphs, and the same graphs decode as transformers does on
    ONNX Runtime (the engines cannot run here)."""
    rtx = importlib.util.find_spec("tensorrt_rtx") is not None
    model, inputs = mllama_model(), mllama_inputs()
    options: dict[str, Any] = {"backend": "tensorrt-rtx"} if rtx else {}
    generation = GENERATION if rtx else {**GENERATION, "attention": "decomposed"}
    module = pipeline.convert(model, inputs, generation=generation, validate=False, **options)
    assert not any(n.op_type == "Attention" for n in module.decoder.onnx.graph.node)
    if rtx:
        assert module.encoder.engine_bytes and module.decoder.engine_bytes
    assert torch.equal(
        module.generate(**inputs, max_new_tokens=6), transformers_generate(model, inputs, max_new_tokens=6)
    )


def test_per_token_rows_pads_with_the_last_row_as_generate() -> None:
    mask = torch.tensor([[[0], [1], [2]]])
    assert per_token_rows(mask, 5)[0, :, 0].tolist() == [0, 1, 2, 2, 2]
    assert per_token_rows(mask, 2)[0, :, 0].tolist() == [1, 2]


def test_idefics_generates_as_transformers_does_and_tensorrt_rtx_builds_both_graphs() -> None:
    """IDEFICS caches no image state: its decode steps are handed the vision tower's output again (found among the
    prefill's outputs: two rows per prompt, one per image), which the step takes as an input and runs the perceiver
    and the gated cross-attention on. The real TensorRT-RTX builder takes both graphs (the image mask's one head
    broadcast over the heads of its decomposed attention), and the same graphs generate as
    ``model.generate`` on ONNX Runtime (the engine cannot run here)."""
    rtx = importlib.util.find_spec("tensorrt_rtx") is not None
    model, inputs = idefics_model(), idefics_inputs()
    backend = "tensorrt-rtx" if rtx else "onnxruntime"
    module = pipeline.convert(model, inputs, generation=GENERATION, backend=backend, validate=False)
    assert isinstance(module, CrossImagesModule)
    assert [spec.name for spec in module.encoder.io.outputs] == ["image_encoder_embeddings"]
    if rtx:
        assert module.encoder.engine_bytes and module.decoder.engine_bytes
    assert torch.equal(
        module.generate(**inputs, max_new_tokens=8), transformers_generate(model, inputs, max_new_tokens=8)
    )
    beams: dict[str, Any] = {"max_new_tokens": 6, "num_beams": 2}
    assert torch.equal(module.generate(**inputs, **beams), transformers_generate(model, inputs, **beams))
