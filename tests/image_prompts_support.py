"""Tiny vision-language models with processors of their own, as a new user makes them (a config, ``save_pretrained``, a
processor built and saved locally: nothing downloaded), converted once per test process: Llama 3.2 Vision (Mllama,
cross-attended images) and Kosmos-2 (images placed by its processor's ``image_embeds_position_mask``). Shared by the
CLI's and the Triton server's tests (``tests/pipeline/generation/test_cli_cross_images.py``,
``tests/pipeline/serving/test_serve_images.py``): a file that runs after the other in the same worker reuses the
converted directories."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import tiny_models
import torch
import transformers
from model_sources.transformers_all_models import open_gates

#: each kind's cache: Kosmos-2's prompts hold its 64 image tokens
GENERATION = {"mllama": {"max_length": 48, "max_batch": 2}, "kosmos2": {"max_length": 96, "max_batch": 2}}
#: each kind's two prompts (Mllama's with its processor's image placeholder; Kosmos-2's processor puts the image first)
PROMPTS = {
    "mllama": ["<|image|> w5 w9 w12", "<|image|> w40 w41 w42 w43 w44"],
    "kosmos2": ["<grounding> w5 w9 w12 w17", "w40 w41 w42 w43 w44 w6 w7 w88"],
}


@dataclass(frozen=True)
class ImageModel:
    """A converted tiny model's saved directory, its processor's directory and two image files."""

    kind: str
    converted: Path
    processor: Path
    images: tuple[Path, Path]

    def inputs(self, rows: int = 2) -> dict[str, torch.Tensor]:
        """The first ``rows`` prompts with their images through the processor, left-padded, as ``model.generate``
        takes them (each prompt's images a list of its own for Mllama's processor)."""
        from PIL import Image

        processor = transformers.AutoProcessor.from_pretrained(self.processor, local_files_only=True)
        processor.tokenizer.padding_side = "left"
        pictures = [Image.open(path).convert("RGB") for path in self.images[:rows]]
        images: list[Any] = [[picture] for picture in pictures] if self.kind == "mllama" else pictures
        made = processor(text=PROMPTS[self.kind][:rows], images=images, return_tensors="pt", padding=True)
        return {name: torch.as_tensor(value) for name, value in made.items()}

    def decode(self, ids: list[int]) -> str:
        """The text the CLI prints for ``ids``."""
        processor = transformers.AutoProcessor.from_pretrained(self.processor, local_files_only=True)
        return str(processor.tokenizer.decode(ids, skip_special_tokens=True))


def word_tokenizer(specials: dict[str, int], first: int, last: int, **tokens: str) -> Any:
    """A word-level tokenizer: ``w{i}`` is id ``i`` for ``first <= i < last``, and the given special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({**specials, **{f"w{i}": i for i in range(first, last)}}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", **tokens)


def mllama(directory: Path) -> None:
    """A tiny Llama 3.2 Vision (one cross-attention layer, images of up to 2 tiles of 16 x 16) and its processor."""
    vision = transformers.MllamaVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_global_layers=1, attention_heads=2,
        image_size=16, patch_size=8, max_num_tiles=2, intermediate_layers_indices=[0], vision_output_dim=32,
        supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]],
    )  # fmt: skip
    text = transformers.MllamaTextConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, cross_attention_layers=[1], max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    config = transformers.MllamaConfig(vision_config=vision, text_config=text, image_token_index=127)
    model = tiny_models.lively(
        lambda: transformers.MllamaForConditionalGeneration(config), seed=0, std=0.3, keep_eos=False
    )
    open_gates(model)  # a trained checkpoint's gates are open; transformers starts them closed
    model.save_pretrained(directory / "model")
    specials = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "<|python_tag|>": 4, "<|image|>": 127}
    tokenizer = word_tokenizer(specials, 5, 127, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|image|>", "<|python_tag|>"]})
    images = transformers.MllamaImageProcessor(size={"height": 16, "width": 16}, max_image_tiles=2)
    transformers.MllamaProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(directory / "processor")


def kosmos2_processor(directory: Path) -> Any:
    """Kosmos-2's processor for a tiny model (16 patch index tokens, 32 x 32 images), saved to ``directory``."""
    specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    tokenizer = word_tokenizer(specials, 4, 100, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    images = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = transformers.Kosmos2Processor(image_processor=images, tokenizer=tokenizer, num_patch_index_tokens=16)
    processor.save_pretrained(directory)
    return processor


def kosmos2(directory: Path) -> None:
    """A tiny Kosmos-2 (64 image tokens, as its processor writes them) and its processor."""
    processor = kosmos2_processor(directory / "processor")
    text = {
        "vocab_size": len(processor.tokenizer), "embed_dim": 32, "layers": 2, "ffn_dim": 64, "attention_heads": 2,
        "max_position_embeddings": 128, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
    }  # fmt: skip
    vision = {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "image_size": 32, "patch_size": 8,
    }  # fmt: skip
    config = transformers.Kosmos2Config(text_config=text, vision_config=vision, latent_query_num=64)
    model = tiny_models.lively(
        lambda: transformers.Kosmos2ForConditionalGeneration(config), seed=0, std=0.7, keep_eos=False
    )
    model.save_pretrained(directory / "model")


MODELS = {
    "mllama": (mllama, transformers.MllamaForConditionalGeneration),
    "kosmos2": (kosmos2, transformers.Kosmos2ForConditionalGeneration),
}


def image_model(kind: str, root: Path) -> ImageModel:
    """The converted ``kind`` under ``root`` (a session's temporary directory), converted on first use: the model and
    processor saved, loaded back with ``from_pretrained``, converted on the processor's two prompts (not validated:
    the tests judge the module's own ``generate``)."""
    from PIL import Image

    import pipeline

    directory = root / f"image-prompts-{kind}"
    made = ImageModel(
        kind, directory / "converted", directory / "processor", (directory / "0.png", directory / "1.png")
    )
    if made.converted.is_dir():
        return made
    directory.mkdir(parents=True, exist_ok=True)
    build, model_class = MODELS[kind]
    build(directory)
    pixels = torch.Generator().manual_seed(4)
    for path, size in zip(made.images, ((20, 24), (30, 14)), strict=True):
        array = torch.randint(0, 256, (*size, 3), generator=pixels, dtype=torch.uint8).numpy()
        Image.fromarray(array).save(path)
    model = model_class.from_pretrained(directory / "model").eval()
    model.generation_config.eos_token_id = None  # every row decodes every token
    pipeline.convert(model, made.inputs(), generation=GENERATION[kind], validate=False).save(made.converted)
    return made
