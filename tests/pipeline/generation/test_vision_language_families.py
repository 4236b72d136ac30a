"""Vision-language families that needed more of the step than LLaVA's, each from the every-type source's small config
(``tests/model_sources/transformers_all_models.py``, random weights) and judged against transformers' own
``model.generate`` on a left-padded batch of two prompts with an image each:

- LFM2-VL cuts the prompt's columns off the cache-wide mask (``attention_mask[:, -tokens:]``): a prompt that filled
  the cache would be another branch, so a prompt leaves one position of the cache and the export keeps it dynamic;
  for TensorRT its vision graph holds the image's integer inputs, which decide a mask its tower selects by;
- BLIP-2 hands its embeddings to its language model (OPT), whose output it keeps apart: the step calls that language
  model, and the image features are placed at its image tokens;
- HunYuan-VL's image positions keep the grid's columns and rows as they are wherever the image starts, and count the
  request's images on one axis: read from the model on a probe and laid out so at run time;
- Qwen3.5's text model has linear-attention layers (recurrent states): its step takes one token, the prompt is fed
  token by token, an image token's step given its feature row, at the model's M-RoPE positions.

Nothing is downloaded."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
from model_sources import transformers_all_models as every
from tiny_models import TINY_TEXT, drawn_by_fan_in

import pipeline
from converters.errors import InputError
from pipeline.runtime.generation.image_positions import ImagePositions
from pipeline.runtime.generation.vision_language import VisionLanguageModule

GENERATION = {"max_length": 64, "max_batch": 4}
GREEDY: dict[str, Any] = {"max_new_tokens": 8, "do_sample": False}
PAD = 2


def family(kind: str, class_name: str, std: float = 1.5) -> tuple[Any, dict[str, torch.Tensor]]:
    """The every-type source's model of ``kind``, its matrices drawn wider (greedy tokens vary) and eos off, and a
    batch of its sample's prompt left-padded by :data:`PAD` and a copy with :data:`PAD` more text tokens before it
    and another image."""
    model, (_args, sample) = every.build(kind, class_name)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0, std / parameter.shape[-1] ** 0.5, generator=generator)
    model.generation_config.eos_token_id = None
    ids = sample["input_ids"]
    mask = sample.get("attention_mask", torch.ones_like(ids))
    pad = torch.zeros(1, PAD, dtype=ids.dtype)
    batch = {
        "input_ids": torch.cat([torch.cat([pad, ids], 1), torch.cat([ids[:, -PAD:], ids], 1)]),
        "attention_mask": torch.cat([torch.cat([pad, mask], 1), torch.cat([torch.ones_like(pad), mask], 1)]),
    }
    for name, value in sample.items():
        if name in batch:
            continue
        if value.shape == ids.shape:  # one per token (mm_token_type_ids): the tokens before the prompt are text
            batch[name] = torch.cat([torch.cat([torch.zeros_like(pad), value], 1)] * 2).to(value.dtype)
        elif value.is_floating_point():
            batch[name] = torch.cat([value, torch.randn(value.shape, generator=generator)])
        else:
            batch[name] = torch.cat([value, value])
    return model, batch


def generates_as_transformers(model: Any, module: VisionLanguageModule, inputs: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        expected = model.generate(**inputs, **GREEDY)
    assert torch.equal(module.generate(**inputs, **GREEDY), expected)
    beams = {**GREEDY, "max_new_tokens": 4, "num_beams": 2}
    with torch.no_grad():
        assert torch.equal(module.generate(**inputs, **beams), model.generate(**inputs, **beams))


def test_lfm2_vl_keeps_the_prompt_dynamic_and_builds_on_tensorrt_rtx() -> None:
    """The step's prompts stop one position short of the cache: LFM2's slice of the mask is then never the whole
    mask, which torch.export proves over the range (the export failed on the guard ``tokens != 24`` before). Its tower
    drops padding token slots by a mask computed from ``spatial_shapes``: a ``NonZero``, which TensorRT-RTX's parser
    refuses (the vision graph ran segmented); for TensorRT the vision graph holds the image's integer inputs at the
    sample's values (TensorRT takes them by value anyway), the mask is a constant, and the real builder builds both
    graphs."""
    pytest.importorskip("tensorrt_rtx")
    model, inputs = family("lfm2_vl", "Lfm2VlForConditionalGeneration")
    one = {name: value[:1] for name, value in inputs.items()}
    generation = {"max_length": 24, "max_batch": 1}
    module = pipeline.convert(model, one, generation=generation, backend="tensorrt-rtx", validate=False)
    assert isinstance(module, VisionLanguageModule)
    assert module.generation.max_prompt == generation["max_length"] - 1
    assert set(module.fixed_inputs) == {"spatial_shapes", "pixel_attention_mask"}
    assert module.vision.engine_bytes and module.step.engine_bytes


def test_blip2_steps_through_the_language_model_it_hands_its_embeddings() -> None:
    """BLIP-2's output holds its language model's output apart (no cache of its own): the step calls the language
    model with the embeddings, the image features placed at the image tokens; the image changes the decoding."""
    model, inputs = family("blip-2", "Blip2ForConditionalGeneration", std=3.0)
    module = pipeline.convert(model, inputs, generation=GENERATION, validate=False)
    assert isinstance(module, VisionLanguageModule)
    generates_as_transformers(model, module, inputs)
    other = {**inputs, "pixel_values": inputs["pixel_values"].flip(0)}
    assert not torch.equal(module.generate(**other, **GREEDY), module.generate(**inputs, **GREEDY))
    with torch.no_grad():
        assert torch.equal(module.generate(**other, **GREEDY), model.generate(**other, **GREEDY))
    assert module.generation.max_prompt == GENERATION["max_length"] - 1  # a prompt leaves a position of the cache
    full = torch.ones(1, GENERATION["max_length"], dtype=torch.int64)
    with pytest.raises(InputError, match="'max_length': 65"):
        module.generate(full, attention_mask=full, pixel_values=inputs["pixel_values"][:1])


def test_hunyuan_vl_positions_count_the_requests_images() -> None:
    """HunYuan-VL's grid tokens take their column and row within the image and, on the third axis, the image's number
    in the request (the second prompt's image is image 1); the tokens around the grid go on from the text. The module
    lays positions out as the model's own ``get_rope_index`` does, and decodes as transformers does."""
    model, inputs = family("hunyuan_vl", "HunYuanVLForConditionalGeneration")
    module = pipeline.convert(model, inputs, generation=GENERATION, validate=False)
    assert isinstance(module, VisionLanguageModule)
    laid = module.positions
    assert laid is not None and laid.counted is not None and laid.anchored is not None
    assert bool(laid.counted.any()) and not bool(laid.anchored.all())
    names = ("input_ids", "mm_token_type_ids", "image_grid_thw", "attention_mask")
    expected, _deltas = model.model.get_rope_index(*(inputs[name] for name in names))
    kept = inputs["attention_mask"].bool().expand_as(expected)
    assert torch.equal(laid.prompt(inputs["input_ids"], inputs["attention_mask"])[kept], expected[kept])
    generates_as_transformers(model, module, inputs)


def test_image_positions_anchor_and_count_where_the_rule_says() -> None:
    """``anchored`` positions move with where the image starts, ``counted`` ones with its number in the request
    (counted over the prompts in order); saved and read back, the same rule."""
    block = torch.tensor([[0, 0, 1, 2], [0, 0, 0, 3], [0, 0, 0, 4]])
    anchored = torch.tensor([[True, False, False, True]] * 3)
    counted = torch.tensor([[False, False, False, False], [False, False, False, False], [False, True, True, False]])
    rule = ImagePositions(block, 4, 9, anchored, counted)
    ids = torch.tensor([[5, 9, 9, 9, 9, 6], [0, 7, 9, 9, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    laid = rule.prompt(ids, mask)
    assert laid[:, 0, 1:5].tolist() == [[1, 0, 1, 3], [1, 0, 0, 4], [1, 0, 0, 5]]
    assert laid[:, 1, 2:6].tolist() == [[1, 0, 1, 3], [1, 0, 0, 4], [1, 1, 1, 5]]
    assert laid[:, 0, 5].tolist() == [5, 5, 5]
    again = ImagePositions.from_json(rule.to_json())
    assert torch.equal(again.prompt(ids, mask), laid)
    plain = ImagePositions(block, 4, 9)
    assert "anchored" not in plain.to_json() and ImagePositions.from_json(plain.to_json()).anchored is None


def test_instructblip_video_places_its_frames_features_at_its_video_token() -> None:
    """InstructBLIP-Video has no ``get_image_features``: its ``pixel_values`` are a video's frames, whose features
    (``get_video_features``) replace its video token; converted, it decodes as transformers does."""
    from pipeline.generation.vision_graph import image_token_id
    from pipeline.generation.vision_inputs import image_features_method, image_input_names

    model, inputs = family("instructblipvideo", "InstructBlipVideoForConditionalGeneration")
    assert image_features_method(model).__name__ == "get_video_features"
    assert image_token_id(model) == model.config.video_token_index
    assert image_input_names(model)[:3] == ["pixel_values", "qformer_input_ids", "qformer_attention_mask"]
    module = pipeline.convert(model, inputs, generation=GENERATION)
    assert isinstance(module, VisionLanguageModule)
    generates_as_transformers(model, module, inputs)


def tiny_qwen3_5() -> tuple[Any, dict[str, torch.Tensor]]:
    """A tiny Qwen3.5 (a linear-attention layer, then an attention layer; a one-block tower) and a left-padded batch
    of two prompts, each an image of 4 tokens then text; the second prompt's image another."""
    import transformers

    torch.manual_seed(0)
    text = {
        **TINY_TEXT,
        "layer_types": ["linear_attention", "full_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "max_position_embeddings": 64,
        "pad_token_id": 0,
    }
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 8}
    vision |= {"out_hidden_size": 32, "num_position_embeddings": 64}
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=127)
    model = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(0)
    model = drawn_by_fan_in(model, generator)
    prompt = [127] * 4 + [60, 85, 28, 90, 58, 63, 62, 75]
    ids = torch.tensor([[0, 0, *prompt], [62, 75, *prompt]])
    mask = torch.ones_like(ids)
    mask[0, :PAD] = 0
    patches = 16 * 3 * 2 * 8 * 8 // 16  # an image of 4 x 4 patches (2 frames of 3 x 8 x 8 each), merged 2 x 2
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": (ids == 127).to(torch.int64),
        "pixel_values": torch.randn(32, patches, generator=generator),
        "image_grid_thw": torch.tensor([[1, 4, 4], [1, 4, 4]]),
    }
    return model, batch


def test_a_linear_attention_vision_language_model_steps_one_token_at_a_time() -> None:
    """Qwen3.5 (Gated DeltaNet linear attention beside attention, M-RoPE): the step takes one token and the layers'
    states (``past_key_values.0.conv``/``.recurrent``) beside layer 1's keys and values; the prompt runs on its prompt
    graph in runs of 8 tokens, each run given its image tokens' feature rows. A left-padded batch gives transformers'
    greedy tokens and every step's scores (within 1e-3), another image changes them as it changes transformers', and
    2 beams give its beams; saved and loaded, the same; TensorRT-RTX's real builder builds the three graphs."""
    from pipeline.runtime.generation.layout import past_name

    rtx = importlib.util.find_spec("tensorrt_rtx") is not None
    model, inputs = tiny_qwen3_5()
    backend: dict[str, Any] = {"backend": "tensorrt-rtx", "trt_engine_cache": False} if rtx else {}
    # a prompt graph of 8 tokens per run: the prompts of 14 tokens go in two runs, the second one row at a time
    module = pipeline.convert(model, inputs, generation={**GENERATION, "max_prompt": 8}, validate=False, **backend)
    assert isinstance(module, VisionLanguageModule)
    assert module.generation.max_prompt == 1 and module.positions is not None
    assert module.generation.prompt_tokens == 8 and module.step.prompt_graph is not None
    names = {spec.name for spec in module.step.io.inputs}
    assert {past_name(0, "conv"), past_name(0, "recurrent"), past_name(1, "key")} <= names
    if rtx:
        assert module.vision.engine_bytes and module.step.engine_bytes and module.step.prompt_graph.engine_bytes
    scored = {**GREEDY, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        theirs = model.generate(**inputs, **scored)
    ours: Any = module.generate(**inputs, **scored)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert len(set(ours.sequences[:, -8:].flatten().tolist())) > 2  # the tokens vary: a decoding bug would show
    assert max(float((a - b).abs().max()) for a, b in zip(ours.scores, theirs.scores, strict=True)) < 1e-3
    other = {**inputs, "pixel_values": torch.cat([inputs["pixel_values"][16:], inputs["pixel_values"][:16]])}
    with torch.no_grad():
        expected = model.generate(**other, **GREEDY)
    assert torch.equal(module.generate(**other, **GREEDY), expected)
    assert not torch.equal(expected, theirs.sequences)  # the image changes the decoding
    beams = {**GREEDY, "max_new_tokens": 4, "num_beams": 2}  # the states' rows reordered with the keys and values
    with torch.no_grad():
        assert torch.equal(module.generate(**inputs, **beams), model.generate(**inputs, **beams))
    with tempfile.TemporaryDirectory() as directory:
        loaded = pipeline.load(module.save(Path(directory) / "qwen3_5"))
        assert isinstance(loaded, VisionLanguageModule) and loaded.step.prompt_graph is not None
        assert torch.equal(loaded.generate(**inputs, **GREEDY), theirs.sequences)
