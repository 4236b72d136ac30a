"""Vision-language decoders (``convert(vlm, {"input_ids", "attention_mask", "pixel_values"}, generation=...)``)
judged against transformers' own ``model.generate`` on tiny random models: LLaVA (CLIP tower, Llama text) and Gemma 3
(SigLIP tower, scaled embeddings, sliding windows). Greedy and beam-search sequences token-identical on a left-padded
batch of 2, a saved and loaded directory, the errors a caller meets, and TensorRT-RTX's real builder on both graphs.
Nothing is downloaded: the models are built from their configs."""

from __future__ import annotations

from collections.abc import Callable
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
from pipeline.cli.convert import generate_command
from pipeline.runtime.generation.vision_language import STEP_FILE, VISION_FILE, VisionLanguageModule

GENERATION = {"max_length": 48, "max_batch": 8}
IMAGE = 127
TEXT: dict[str, Any] = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
HEADS: dict[str, Any] = {
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 64,
}
TOWER: dict[str, Any] = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


def lively(make: Callable[[], Any], seed: int, std: float) -> Any:
    """:func:`tiny_models.lively` without an end-of-sequence token: every row decodes every token."""
    return tiny_models.lively(make, seed, std, keep_eos=False)


def prompts(image_tokens: int, pixels: int) -> dict[str, torch.Tensor]:
    """Two prompts, one image each: the second left-padded by 2, its image tokens one place later."""
    ids = torch.randint(3, 100, (2, image_tokens + 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[0, 2 : 2 + image_tokens] = IMAGE
    mask[1, :2] = 0
    ids[1, :2] = 0
    ids[1, 3 : 3 + image_tokens] = IMAGE
    images = torch.randn(2, 3, pixels, pixels, generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": images}


def llava_model() -> Any:
    vision = transformers.CLIPVisionConfig(**TOWER, image_size=32, patch_size=8)
    text = transformers.LlamaConfig(**TEXT, **HEADS)
    config = transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=IMAGE, image_seq_length=16
    )
    return lively(lambda: transformers.LlavaForConditionalGeneration(config), seed=0, std=0.3)


@pytest.fixture(scope="module")
def llava() -> Any:
    return llava_model()


@pytest.fixture(scope="module")
def llava_inputs() -> dict[str, torch.Tensor]:
    return prompts(16, 32)


@pytest.fixture(scope="module")
def llava_module(llava: Any, llava_inputs: dict[str, torch.Tensor]) -> VisionLanguageModule:
    # validated: each graph against PyTorch, then the sample's greedy tokens against model.generate
    module = pipeline.convert(llava, llava_inputs, generation=GENERATION)
    assert isinstance(module, VisionLanguageModule)
    return module


def varied(sequences: torch.Tensor) -> None:
    """The decoding is worth comparing: every row changes its token."""
    assert all(len(set(row.tolist())) >= 3 for row in sequences), sequences


def test_llava_greedy_equals_transformers_on_a_padded_batch(
    llava: Any, llava_module: VisionLanguageModule, llava_inputs: dict[str, torch.Tensor]
) -> None:
    ids = llava_inputs["input_ids"]
    out = llava_module.generate(
        ids, attention_mask=llava_inputs["attention_mask"], pixel_values=llava_inputs["pixel_values"], max_new_tokens=16
    )
    expected = transformers_generate(llava, llava_inputs, max_new_tokens=16)
    varied(expected[:, ids.shape[1] :])
    assert torch.equal(out, expected)
    streamed = list(llava_module.stream(**llava_inputs, max_new_tokens=16))
    assert torch.equal(torch.stack(streamed, dim=1), expected[:, ids.shape[1] :])


def test_validation_judges_every_steps_logits_against_transformers(llava_module: VisionLanguageModule) -> None:
    accuracy = llava_module.report.accuracy
    assert accuracy is not None and accuracy.decoding is not None
    decoding = accuracy.decoding
    assert decoding.passed and decoding.rows == 2 and decoding.computed_in == "float32"
    assert len(decoding.per_step) == 8 and all(step.elements == 2 * 128 for step in decoding.per_step)
    assert max(step.max_abs for step in decoding.per_step) < 1e-3


def test_a_departed_decoding_is_judged_on_pytorchs_tokens(
    llava_module: VisionLanguageModule, llava_inputs: dict[str, torch.Tensor]
) -> None:
    """What the validation does when a lower precision's greedy choice departs at a near tie: the module is fed
    PyTorch's tokens (a logits processor), its raw logits are those of PyTorch's path, and the report counts the
    tokens it chose on its own and says where they first differ."""
    from pipeline.generation.generate_scores import diverged, follow_tokens, greedy_options

    width = llava_inputs["input_ids"].shape[1]
    own = llava_module.generate(**llava_inputs, **greedy_options(6))
    wanted = own.sequences.clone()
    wanted[:, width + 2 :] = (wanted[:, width + 2 :] + 1) % 128  # another path from the third new token on
    followed = llava_module.generate(**llava_inputs, **greedy_options(6), logits_processor=follow_tokens(wanted))
    assert torch.equal(followed.sequences, wanted)
    assert not torch.equal(followed.logits[3], own.logits[3])  # the raw logits of the path it was fed
    report = llava_module.report.accuracy.decoding
    departed = diverged(report, wanted, own.sequences, width)
    assert (departed.greedy, departed.greedy_tokens, departed.first_divergence) == (4, 12, 2)
    assert "judged on PyTorch's tokens" in departed.note and "are identical" not in departed.note


def test_llava_beam_search_equals_transformers(
    llava: Any, llava_module: VisionLanguageModule, llava_inputs: dict[str, torch.Tensor]
) -> None:
    options: dict[str, Any] = {"max_new_tokens": 8, "num_beams": 4, "num_return_sequences": 2}
    assert torch.equal(
        llava_module.generate(**llava_inputs, **options), transformers_generate(llava, llava_inputs, **options)
    )


def test_a_generated_image_token_is_embedded_as_the_model_embeds_it(
    llava: Any, llava_module: VisionLanguageModule, llava_inputs: dict[str, torch.Tensor]
) -> None:
    """A decode step places no image: an image token the decoding produces (forced here by a processor) is the
    model's own embedding of it, as in ``model.generate``."""
    bias = torch.zeros(llava.config.text_config.vocab_size)
    bias[IMAGE] = 1e4

    def image_token_first(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores + bias if ids.shape[1] == llava_inputs["input_ids"].shape[1] else scores

    processors = transformers.LogitsProcessorList([image_token_first])
    out = llava_module.generate(**llava_inputs, max_new_tokens=6, logits_processor=processors)
    expected = transformers_generate(llava, llava_inputs, max_new_tokens=6, logits_processor=processors)
    assert bool((expected[:, llava_inputs["input_ids"].shape[1]] == IMAGE).all())
    assert torch.equal(out, expected)


def test_a_saved_directory_loads_and_generates_the_same(
    llava_module: VisionLanguageModule, llava_inputs: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    target = llava_module.save(tmp_path / "llava")
    assert {p.name for p in target.iterdir()} == {VISION_FILE, STEP_FILE, "vision_language.json"}
    loaded = pipeline.load(target)
    assert isinstance(loaded, VisionLanguageModule)
    options: dict[str, Any] = {"max_new_tokens": 8}
    assert torch.equal(loaded.generate(**llava_inputs, **options), llava_module.generate(**llava_inputs, **options))
    llava_module.save(target)  # replaces the directory (atomically)
    assert {p.name for p in tmp_path.iterdir()} == {"llava"}


def test_requests_from_six_threads_get_the_single_threaded_answers(
    llava_module: VisionLanguageModule, llava_inputs: dict[str, torch.Tensor]
) -> None:
    """A server's use: the vision graph and the text step called from 6 threads at once, every answer as alone
    (tests/pipeline/module/test_concurrency.py: the decoder-only module)."""
    assert tiny_models.answers_from_threads(tiny_models.mixed_requests(llava_module, llava_inputs)) == []


def test_request_slots_bound_the_requests_at_once(
    llava_module: VisionLanguageModule, llava_inputs: dict[str, torch.Tensor]
) -> None:
    """Each request holds one of the module's request slots from its first graph run to its last (its cache is its
    own): one slot refuses a second stream of the holding thread and times out another thread's request; 2 slots
    serve 6 threads, every answer as alone."""
    tiny_models.requests_wait_for_slots(llava_module, llava_inputs)


def test_bad_calls_name_the_fix(llava_module: VisionLanguageModule, llava_inputs: dict[str, torch.Tensor]) -> None:
    ids, mask = llava_inputs["input_ids"], llava_inputs["attention_mask"]
    with pytest.raises(InputError, match="pixel_values"):
        llava_module.generate(ids, attention_mask=mask, max_new_tokens=4)
    with pytest.raises(InputError, match="image tokens"):
        llava_module.generate(ids, attention_mask=mask, pixel_values=llava_inputs["pixel_values"][:1])
    with pytest.raises(InputError, match="max_batch"):
        llava_module.generate(**llava_inputs, num_beams=5, max_new_tokens=4)
    with pytest.raises(InputError, match="left padding"):
        llava_module.generate(ids, attention_mask=mask.flip(1), pixel_values=llava_inputs["pixel_values"])
    with pytest.raises(InputError, match="not_an_option"):
        llava_module.generate(**llava_inputs, not_an_option=1)


def tiny_processor(directory: Path) -> Any:
    """A LLaVA processor for the tiny LLaVA, saved to ``directory``: a word-level tokenizer over the model's 128 ids
    ("w3" is id 3, "<image>" the image token 127) and CLIP's image processor at 32 x 32 (16 image tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = {"<pad>": 0, "<unk>": 1, "<s>": 2, **{f"w{i}": i for i in range(3, IMAGE)}, "<image>": IMAGE}
    words = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", pad_token="<pad>", extra_special_tokens={"image_token": "<image>"}
    )
    images = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = transformers.LlavaProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default",
        image_token="<image>", num_additional_image_tokens=1,
    )  # fmt: skip
    processor.save_pretrained(directory)
    return processor


def test_the_cli_generates_from_images_and_prompts_through_the_processor(
    llava_module: VisionLanguageModule, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pipeline generate DIR --processor P --image a.png --prompt '... <image> ...'`` (twice): the processor's
    prompts, left-padded, and pixels; each line the prompt's new tokens as text, as ``generate`` gives them."""
    from PIL import Image

    from pipeline.cli import main

    processor = tiny_processor(tmp_path / "processor")
    prompts = ["w5 <image> w9 w12", "<image> w40 w41 w42 w43"]
    pixels = torch.Generator().manual_seed(4)
    for index in range(2):
        array = torch.randint(0, 256, (20, 24, 3), generator=pixels, dtype=torch.uint8).numpy()
        Image.fromarray(array).save(tmp_path / f"{index}.png")
    target = llava_module.save(tmp_path / "llava")
    assert generate_command(llava_module, target).startswith(f"pipeline generate {target} --processor DIR --prompt")
    files = [str(tmp_path / f"{i}.png") for i in range(2)]
    pairs = [item for text, file in zip(prompts, files, strict=True) for item in ("--prompt", text, "--image", file)]
    command = ["generate", str(target), "--processor", str(tmp_path / "processor"), *pairs, "--max-new-tokens", "6"]
    assert main(command) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    processor.tokenizer.padding_side = "left"
    images = [Image.open(tmp_path / f"{i}.png").convert("RGB") for i in range(2)]
    inputs = dict(processor(text=prompts, images=images, return_tensors="pt", padding=True))
    assert int((inputs["input_ids"] == IMAGE).sum()) == 32 and inputs["attention_mask"][1, 0] == 1
    out = llava_module.generate(**inputs, max_new_tokens=6)[:, inputs["input_ids"].shape[1] :]
    assert printed == [processor.tokenizer.decode(row) for row in out.tolist()]
    assert main([*command, "--prompt", "w5 <image>"]) == 1
    assert "3 prompt(s) and 2 image(s): each prompt takes one image" in capsys.readouterr().err
    assert main([*command, "--prompt", "w5 w9", "--image", files[0]]) == 1
    assert "a prompt lacks the image placeholder '<image>'" in capsys.readouterr().err


def gemma3_model() -> Any:
    """Gemma 3: SigLIP tower and average-pooled projector, scaled text embeddings, sliding-window layers."""
    vision = transformers.SiglipVisionConfig(**TOWER, image_size=32, patch_size=8)
    text = transformers.Gemma3TextConfig(**TEXT, **HEADS, sliding_window=16, query_pre_attn_scalar=16)
    config = transformers.Gemma3Config(
        vision_config=vision, text_config=text, image_token_index=IMAGE, mm_tokens_per_image=4,
        boi_token_index=125, eoi_token_index=126,
    )  # fmt: skip
    return lively(lambda: transformers.Gemma3ForConditionalGeneration(config), seed=3, std=0.05)


def test_gemma3_greedy_and_beams_equal_transformers() -> None:
    """Gemma 3: SigLIP tower and average-pooled projector, scaled text embeddings, sliding-window layers."""
    model = gemma3_model()
    inputs = prompts(4, 32)
    module = pipeline.convert(model, inputs, generation=GENERATION, validate=False)
    expected = transformers_generate(model, inputs, max_new_tokens=12)
    varied(expected[:, inputs["input_ids"].shape[1] :])
    assert torch.equal(module.generate(**inputs, max_new_tokens=12), expected)
    beams: dict[str, Any] = {"max_new_tokens": 6, "num_beams": 4}
    assert torch.equal(module.generate(**inputs, **beams), transformers_generate(model, inputs, **beams))


def test_gemma3_token_type_ids_make_the_prefills_image_tokens_attend_both_ways(tmp_path: Path) -> None:
    """With the processor's ``token_type_ids`` (1 at image tokens) Gemma 3's prefill lets an image's tokens attend to
    each other both ways: the module takes them, as ``model.generate`` does, and decodes its tokens (which differ
    from those without); saved and loaded, the same."""
    model = gemma3_model()
    inputs = prompts(4, 32)
    typed = {**inputs, "token_type_ids": (inputs["input_ids"] == IMAGE).to(torch.int64)}
    module = pipeline.convert(model, typed, generation=GENERATION)  # validated: tokens and every step's logits
    expected = transformers_generate(model, typed, max_new_tokens=12)
    assert not torch.equal(
        expected, transformers_generate(model, inputs, max_new_tokens=12)
    )  # the types change the decoding
    assert torch.equal(module.generate(**typed, max_new_tokens=12), expected)
    assert torch.equal(
        module.generate(**inputs, max_new_tokens=12), transformers_generate(model, inputs, max_new_tokens=12)
    )
    beams: dict[str, Any] = {"max_new_tokens": 6, "num_beams": 4}
    assert torch.equal(module.generate(**typed, **beams), transformers_generate(model, typed, **beams))
    loaded = pipeline.load(module.save(tmp_path / "gemma3"))
    assert torch.equal(loaded.generate(**typed, max_new_tokens=12), expected)


def test_paligemma_token_type_ids_give_its_bidirectional_prefix() -> None:
    """PaliGemma's ``token_type_ids`` (0: the prefix, image and prompt) make its first call attend both ways over the
    prefix; the validation judges every step's logits against ``model.generate`` given them (a causal prefill's
    logits differed by 1% while its greedy tokens agreed)."""
    vision = transformers.SiglipVisionConfig(**TOWER, image_size=32, patch_size=8)
    config = transformers.PaliGemmaConfig(
        vision_config=vision, text_config=transformers.GemmaConfig(**TEXT, **HEADS), image_token_index=IMAGE,
        projection_dim=32,
    )  # fmt: skip
    config.text_config.num_image_tokens = 16
    model = lively(lambda: transformers.PaliGemmaForConditionalGeneration(config), seed=3, std=0.05)
    inputs = prompts(16, 32)
    typed = {**inputs, "token_type_ids": torch.zeros_like(inputs["input_ids"])}
    module = pipeline.convert(model, typed, generation=GENERATION)
    decoding = module.report.accuracy.decoding
    assert decoding is not None and decoding.passed and decoding.note == ""
    assert torch.equal(
        module.generate(**typed, max_new_tokens=10), transformers_generate(model, typed, max_new_tokens=10)
    )


def test_token_type_ids_for_a_module_converted_without_them_are_refused(
    llava_module: VisionLanguageModule, llava_inputs: dict[str, torch.Tensor]
) -> None:
    types = torch.zeros_like(llava_inputs["input_ids"])
    with pytest.raises(InputError, match="converted from a sample without them"):
        llava_module.generate(**llava_inputs, token_type_ids=types, max_new_tokens=2)


def test_llava_next_image_sizes_are_held_by_the_vision_graph(tmp_path: Path) -> None:
    """LLaVA-NeXT's tower decides its patch grid from ``image_sizes`` in Python: the vision graph holds the sample's,
    and an image of another size is refused with the fix."""
    vision = transformers.CLIPVisionConfig(**TOWER, image_size=32, patch_size=8)
    text = transformers.LlamaConfig(**TEXT, **HEADS)
    config = transformers.LlavaNextConfig(
        vision_config=vision, text_config=text, image_token_index=IMAGE, image_grid_pinpoints=[[32, 32]]
    )
    model = lively(lambda: transformers.LlavaNextForConditionalGeneration(config), seed=0, std=0.3)
    inputs = prompts(36, 32)  # 16 base tokens, 4 rows of 4 grid tokens and a newline each
    inputs["pixel_values"] = torch.randn(2, 2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    inputs["image_sizes"] = torch.tensor([[32, 32], [32, 32]])
    module = pipeline.convert(model, inputs, generation={**GENERATION, "max_length": 64}, validate=False)
    assert isinstance(module, VisionLanguageModule)
    assert list(module.fixed_inputs) == ["image_sizes"]
    expected = transformers_generate(model, inputs, max_new_tokens=10)
    varied(expected[:, inputs["input_ids"].shape[1] :])
    assert torch.equal(module.generate(**inputs, max_new_tokens=10), expected)
    with pytest.raises(InputError, match="image_sizes"):
        module.generate(**{**inputs, "image_sizes": torch.tensor([[32, 32], [32, 64]])}, max_new_tokens=2)
    loaded = pipeline.load(module.save(tmp_path / "llava-next"))
    assert isinstance(loaded, VisionLanguageModule)
    assert torch.equal(loaded.fixed_inputs["image_sizes"], inputs["image_sizes"][:1])
    assert torch.equal(loaded.generate(**inputs, max_new_tokens=10), expected)


def test_tensorrt_rtx_builds_the_vision_graph_and_the_step_in_float16(llava_inputs: dict[str, torch.Tensor]) -> None:
    """The real TensorRT-RTX builder takes both graphs (the step with its context and generation profiles; the image
    features placed by a gather, no NonZero)."""
    pytest.importorskip("tensorrt_rtx")
    generation = {**GENERATION, "attention": "decomposed"}
    module = pipeline.convert(
        llava_model(), llava_inputs, generation=generation, backend="tensorrt-rtx", precision="fp16", validate=False
    )
    assert isinstance(module, VisionLanguageModule)
    assert module.vision.engine_bytes and module.step.engine_bytes


def test_tensorrt_rtx_builds_gemma3s_typed_step_as_one_engine() -> None:
    """Gemma 3 with ``token_type_ids``: the step that takes them (an image's tokens attending both ways in the
    prefill) builds with the real TensorRT-RTX builder as one engine, no segment left to ONNX Runtime."""
    pytest.importorskip("tensorrt_rtx")
    inputs = prompts(4, 32)
    typed = {**inputs, "token_type_ids": (inputs["input_ids"] == IMAGE).to(torch.int64)}
    module = pipeline.convert(gemma3_model(), typed, generation=GENERATION, backend="tensorrt-rtx", validate=False)
    assert isinstance(module, VisionLanguageModule)
    assert module.vision.engine_bytes and module.step.engine_bytes and module.step.report.segments is None


def test_a_captioning_model_the_step_cannot_call_is_an_input_error() -> None:
    """BLIP's captioning head takes pixel_values in every call (it converts with them: test_blip_git.py): given a
    sample of text alone, the causal LM's path would drop its images. That is said, instead of a text-only conversion
    or transformers' TypeError."""
    from model_sources import transformers_all_models as every

    blip, (_args, sample) = every.build("blip", "BlipForConditionalGeneration")
    assert "pixel_values" in sample
    text = {"input_ids": sample["input_ids"]}
    with pytest.raises(InputError, match=r"BlipForConditionalGeneration fails on two tokens.*pixel_values") as caught:
        pipeline.convert(blip, text, generation=GENERATION)
    assert "without generation=" in str(caught.value)
