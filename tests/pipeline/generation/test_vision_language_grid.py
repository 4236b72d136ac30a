"""Vision-language decoders whose tower takes flattened patches and a patch grid (Qwen2-VL's ``pixel_values``
[patches, values] with ``image_grid_thw``) and whose text model takes positions on three axes (M-RoPE), judged against
transformers' own ``model.generate`` on a tiny random Qwen2-VL: the grid held by the vision graph, the positions read
from the model and laid out per image at run time, a saved and loaded directory, the errors a caller meets, and
TensorRT-RTX's real builder on both graphs. Nothing is downloaded: the model is built from its config."""

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
from pipeline.generation.known_values import KnownValues
from pipeline.runtime.generation.image_positions import ImagePositions, image_rows
from pipeline.runtime.generation.vision_language import VisionLanguageModule

IMAGE = 127
GENERATION = {"max_length": 48, "max_batch": 8}
GRID = (1, 4, 4)  # frames, rows and columns of patches: 16 patches, 4 image tokens after the 2x2 merge
PATCH_VALUES = 3 * 2 * 8 * 8  # channels x frames per patch x patch x patch


def qwen2_vl() -> Any:
    text = transformers.Qwen2VLTextConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )
    vision = transformers.Qwen2VLVisionConfig(
        depth=1, embed_dim=32, hidden_size=32, num_heads=2, patch_size=8, temporal_patch_size=2, spatial_merge_size=2
    )
    config = transformers.Qwen2VLConfig(
        text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_id=IMAGE
    )
    make = lambda: transformers.Qwen2VLForConditionalGeneration(config)  # noqa: E731
    return tiny_models.lively(make, 0, 0.3, keep_eos=False)


def grid_prompts(images_in_first_row: int = 1) -> dict[str, torch.Tensor]:
    """Two prompts, the second left-padded by 2; text before and after each image (4 image tokens apiece)."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for row in range(2):
        tokens: list[int] = [] if row == 0 else [0, 0]
        tokens += torch.randint(3, 100, (3,), generator=generator).tolist()
        for _ in range(images_in_first_row if row == 0 else 1):
            tokens += [IMAGE] * 4 + torch.randint(3, 100, (2,), generator=generator).tolist()
        rows.append(tokens)
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.ones_like(ids)
    for row, tokens in enumerate(rows):
        mask[row, : width - len(tokens)] = 0
        if row == 1:
            mask[row, : width - len(tokens) + 2] = 0
    images = int((ids == IMAGE).sum()) // 4
    pixels = torch.randn(images * 16, PATCH_VALUES, generator=torch.Generator().manual_seed(1))
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": (ids == IMAGE).to(torch.int32),
        "pixel_values": pixels,
        "image_grid_thw": torch.tensor([GRID] * images),
    }


@pytest.fixture(scope="module")
def model() -> Any:
    return qwen2_vl()


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    return grid_prompts()


@pytest.fixture(scope="module")
def module(model: Any, inputs: dict[str, torch.Tensor]) -> VisionLanguageModule:
    # validated: each graph against PyTorch, then the sample's greedy tokens against model.generate
    converted = pipeline.convert(model, inputs, generation=GENERATION)
    assert isinstance(converted, VisionLanguageModule)
    return converted


def test_qwen2_vl_greedy_and_beams_equal_transformers(
    model: Any, module: VisionLanguageModule, inputs: dict[str, torch.Tensor]
) -> None:
    assert list(module.fixed_inputs) == ["image_grid_thw"]
    assert module.positions is not None and module.positions.axes == 3
    greedy = transformers_generate(model, inputs, max_new_tokens=12)
    assert len(set(greedy[:, inputs["input_ids"].shape[1] :].flatten().tolist())) > 4  # not one token repeated
    assert torch.equal(module.generate(**inputs, max_new_tokens=12), greedy)
    beams = transformers_generate(model, inputs, max_new_tokens=6, num_beams=3, num_return_sequences=2)
    assert torch.equal(module.generate(**inputs, max_new_tokens=6, num_beams=3, num_return_sequences=2), beams)


def test_positions_are_the_models_own_for_several_images_in_a_row(model: Any, module: VisionLanguageModule) -> None:
    """Two images in one prompt, text between them: the laid-out positions equal the model's ``get_rope_index``,
    and the tokens generated equal transformers' (a prompt the sample did not have)."""
    two = grid_prompts(images_in_first_row=2)
    assert module.positions is not None
    expected, _deltas = model.model.get_rope_index(
        two["input_ids"], two["mm_token_type_ids"], image_grid_thw=two["image_grid_thw"],
        attention_mask=two["attention_mask"],
    )  # fmt: skip
    laid = module.positions.prompt(two["input_ids"], two["attention_mask"])
    kept = two["attention_mask"].bool().expand_as(laid)
    assert torch.equal(laid[kept], expected[kept])
    assert torch.equal(module.generate(**two, max_new_tokens=8), transformers_generate(model, two, max_new_tokens=8))


def test_a_saved_directory_loads_and_generates_the_same(
    model: Any, module: VisionLanguageModule, inputs: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    loaded = pipeline.load(module.save(tmp_path / "qwen2-vl"))
    assert isinstance(loaded, VisionLanguageModule) and loaded.positions is not None
    assert torch.equal(loaded.positions.block, module.positions.block)  # type: ignore[union-attr]
    assert torch.equal(
        loaded.generate(**inputs, max_new_tokens=8), transformers_generate(model, inputs, max_new_tokens=8)
    )


def test_bad_calls_name_the_fix(module: VisionLanguageModule, inputs: dict[str, torch.Tensor]) -> None:
    larger = {**inputs, "image_grid_thw": torch.tensor([[1, 4, 8], [1, 4, 4]])}
    larger["pixel_values"] = torch.randn(48, PATCH_VALUES)
    with pytest.raises(InputError, match=r"image_grid_thw of image 0 is \[\[1, 4, 8\]\].*converted for"):
        module.generate(**larger, max_new_tokens=2)
    video = inputs["mm_token_type_ids"].clone()
    video[video == 1] = 2
    with pytest.raises(InputError, match="images only"):
        module.generate(**{**inputs, "mm_token_type_ids": video}, max_new_tokens=2)
    cut = inputs["input_ids"].clone()
    cut[0, torch.nonzero(cut[0] == IMAGE)[0]] = 5  # an image of 3 tokens, then one of 1: as many tokens in all
    cut[0, -1] = IMAGE
    with pytest.raises(InputError, match="not a whole number of images"):
        module.generate(**{**inputs, "input_ids": cut, "mm_token_type_ids": (cut == IMAGE).int()}, max_new_tokens=2)


def test_flattened_patches_are_cut_by_their_grid() -> None:
    grid = torch.tensor([[1, 2, 2], [1, 2, 4]])
    pixels = torch.arange(12 * 3).reshape(12, 3)
    first, second = image_rows({"pixel_values": pixels, "image_grid_thw": grid})
    assert torch.equal(first["pixel_values"], pixels[:4]) and torch.equal(second["pixel_values"], pixels[4:])
    assert torch.equal(second["image_grid_thw"], grid[1:])
    rows = image_rows({"pixel_values": torch.zeros(2, 3, 8, 8), "image_sizes": torch.tensor([[8, 8], [8, 8]])})
    assert [tuple(r["pixel_values"].shape) for r in rows] == [(1, 3, 8, 8)] * 2
    with pytest.raises(InputError, match="different numbers of images"):
        image_rows({"pixel_values": torch.zeros(2, 3, 8, 8), "image_sizes": torch.tensor([[8, 8]] * 3)})
    with pytest.raises(InputError, match="neither one row per image"):
        image_rows({"pixel_values": pixels, "image_grid_thw": grid, "extra": torch.zeros(5, 2)})


def test_a_known_grid_exports_where_the_same_grid_as_data_cannot() -> None:
    """Code that sizes its output from an integer tensor (``tolist()``) exports with the tensor known, and its values
    are constants of the graph; as a traced input it stops torch.export."""

    class Sized(torch.nn.Module):
        def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            rows = int(grid.prod(-1).sum())
            return x[:rows] * grid.float().sum()

    class Held(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sized = Sized()
            self.held = {"grid": torch.tensor([[1, 2, 3]])}  # as ImageFeatures holds them: not a buffer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with KnownValues() as known:
                return self.sized(x, known.tensor(self.held["grid"]))

    x = torch.randn(10, 4)
    with pytest.raises(Exception, match="data-dependent|guard"):
        torch.export.export(Sized(), (x, torch.tensor([[1, 2, 3]])))
    program = torch.export.export(Held(), (x,))
    assert torch.equal(program.module()(x), x[:6] * 6.0)


def test_an_image_takes_its_block_from_where_it_starts_and_text_goes_on_by_its_extent() -> None:
    rule = ImagePositions(torch.tensor([[0, 0], [0, 1], [0, 0]]), 2, IMAGE)
    ids = torch.tensor([[0, 5, IMAGE, IMAGE, 6]])
    mask = torch.tensor([[0, 1, 1, 1, 1]])
    laid = rule.prompt(ids, mask)
    assert laid[:, 0, 1:].tolist() == [[0, 1, 1, 3], [0, 1, 2, 3], [0, 1, 1, 3]]
    assert ImagePositions.next_positions(laid, mask).tolist() == [[4]]


def test_tensorrt_rtx_builds_the_grid_vision_graph_and_the_three_axis_step(inputs: dict[str, torch.Tensor]) -> None:
    pytest.importorskip("tensorrt_rtx")
    generation = {**GENERATION, "attention": "decomposed"}
    module = pipeline.convert(qwen2_vl(), inputs, generation=generation, backend="tensorrt-rtx", validate=False)
    assert isinstance(module, VisionLanguageModule)
    assert module.vision.engine_bytes and module.step.engine_bytes


def test_a_served_directory_takes_the_grid_with_each_request(module: VisionLanguageModule, tmp_path: Path) -> None:
    """Triton's request for the saved directory holds the grid the vision graph cuts the images by (it is not one of
    the vision graph's inputs: the graph holds it)."""
    from pipeline.serving.repository import _two_graphs

    directory = module.save(tmp_path / "qwen2-vl")
    found = _two_graphs(directory)
    assert found is not None
    specs = {spec.name: spec for spec in found[1]}
    assert {"input_ids", "pixel_values", "image_grid_thw"} <= set(specs)
    assert specs["image_grid_thw"].dtype == "int64" and len(specs["image_grid_thw"].shape) == 2


def test_image_inputs_passed_through_the_outer_get_image_features_kwargs_are_taken() -> None:
    """Video-LLaMA 3's ``get_image_features`` takes ``image_merge_sizes`` through ``**kwargs`` on to its inner model's:
    the vision graph takes it with the grid, and greedy and beam tokens equal transformers' (the every-type source's
    model and sample, not written for this test)."""
    from model_sources import transformers_all_models as every

    from pipeline.generation.vision_inputs import image_input_names

    built, (_, sample) = every.build("video_llama_3", "VideoLlama3ForConditionalGeneration")
    model = tiny_models.lively(lambda: built, 0, 0.3, keep_eos=False)
    assert image_input_names(model) == ["pixel_values", "image_grid_thw", "image_merge_sizes"]
    module = pipeline.convert(model, sample, generation=GENERATION)
    assert [spec.name for spec in module.vision.io.inputs][:1] == ["pixel_values"]
    for options in ({"max_new_tokens": 6}, {"max_new_tokens": 6, "num_beams": 3}):
        assert torch.equal(module.generate(**sample, **options), transformers_generate(model, sample, **options))


def test_image_features_on_the_base_model_alone_are_taken() -> None:
    """Janus (and DeepSeek-VL) have ``get_image_features`` on their base model (``model.model``) only: the conversion
    takes that one, and greedy and beam tokens equal transformers' (the every-type source's model and sample, not
    written for this test). It was refused as "neither a vision-language decoder nor an encoder-decoder"."""
    from model_sources import transformers_all_models as every

    from pipeline.generation.vision_inputs import image_input_names

    built, (_, sample) = every.build("janus", "JanusForConditionalGeneration")
    model = tiny_models.lively(lambda: built, 0, 0.3, keep_eos=False)
    assert not hasattr(model, "get_image_features") and image_input_names(model) == ["pixel_values"]
    module = pipeline.convert(model, sample, generation=GENERATION)
    for options in ({"max_new_tokens": 6}, {"max_new_tokens": 6, "num_beams": 3}):
        assert torch.equal(module.generate(**sample, **options), transformers_generate(model, sample, **options))
