"""Florence-2 (``convert(..., generation=...)``): an encoder-decoder whose ``generate`` prepares its encoder's input
itself, the image features merged into the prompt's embeddings at its image tokens before the text encoder. The
encoder graph is that preparation (``get_encoder()`` alone never sees the image). A tiny random model, a
right-padded batch of two prompts with an image each: greedy and 4-beam sequences token-identical to
``model.generate``, every greedy step's scores within 1e-3, and another image gives other tokens."""

from __future__ import annotations

from pathlib import Path
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


def florence_processor(directory: Path) -> Any:
    """A Florence-2 processor for the tiny model, saved to ``directory``: a word-level tokenizer over its 96 ids ("w5"
    is id 5, "<image>" the image token) and CLIP's image processor at 8 x 8 (5 image tokens, which the processor puts
    before each prompt's text itself)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, IMAGE_TOKEN)}}
    words = Tokenizer(models.WordLevel({**vocabulary, "<image>": IMAGE_TOKEN}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        extra_special_tokens={"image_token": "<image>"},
    )  # fmt: skip
    images = transformers.CLIPImageProcessor(
        size={"height": 8, "width": 8}, do_center_crop=False, image_seq_length=IMAGE_TOKENS
    )
    processor = transformers.Florence2Processor(image_processor=images, tokenizer=tokenizer)
    processor.save_pretrained(directory)
    return processor


def test_the_cli_generates_from_images_and_prompts_through_the_processor(
    module: EncoderDecoderModule, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pipeline generate DIR --processor P --image a.png --prompt TEXT`` (twice), the line ``convert`` prints: the
    processor puts the image tokens before each prompt, the sources right-padded; each line the decoder's new tokens
    as text, as ``generate`` gives them."""
    from PIL import Image

    from pipeline.cli import main
    from pipeline.cli.convert import generate_command

    processor = florence_processor(tmp_path / "processor")
    prompts = ["w5 w9 w12", "w40 w41 w42 w43 w44 w45"]
    pixels = torch.Generator().manual_seed(4)
    files = []
    for index in range(2):
        array = torch.randint(0, 256, (20, 24, 3), generator=pixels, dtype=torch.uint8).numpy()
        Image.fromarray(array).save(tmp_path / f"{index}.png")
        files.append(str(tmp_path / f"{index}.png"))
    target = module.save(tmp_path / "florence")
    assert (
        generate_command(module, target) == f"pipeline generate {target} --processor DIR --prompt 'TEXT' --image FILE"
    )
    pairs = [item for text, file in zip(prompts, files, strict=True) for item in ("--prompt", text, "--image", file)]
    command = ["generate", str(target), "--processor", str(tmp_path / "processor"), *pairs, "--max-new-tokens", "6"]
    assert main(command) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    processor.tokenizer.padding_side = "right"
    images = [Image.open(file).convert("RGB") for file in files]
    inputs = dict(processor(text=prompts, images=images, return_tensors="pt", padding=True))
    assert inputs["attention_mask"][0, -1] == 0 and int((inputs["input_ids"] == IMAGE_TOKEN).sum()) == 2 * IMAGE_TOKENS
    out = module.generate(**inputs, max_new_tokens=6)[:, 1:]
    expected = [processor.tokenizer.decode(row, skip_special_tokens=True) for row in out.tolist()]
    assert printed == expected and any(expected), printed
    assert main(["generate", str(target), "--prompt-ids", "5,9", "--max-new-tokens", "2"]) == 1
    assert "--prompt TEXT and --image FILE pairs through its --processor DIR" in capsys.readouterr().err
