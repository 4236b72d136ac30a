"""``pipeline generate DIR --image FILE --prompt TEXT --processor DIR``: a vision-language model's prompts and images
through its own processor (``AutoProcessor.from_pretrained``, offline), which writes the image placeholder tokens
and the pixel inputs the model was trained on. Images are read with Pillow (any format it opens), as RGB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from converters.errors import InputError


def load_processor(directory: Path) -> Any:
    """The model's processor from a local directory (offline)."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(
            f"--processor {directory}: no processor loads from it ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]})",
            fix="give the directory the model's processor was saved to (processor.save_pretrained)",
        ) from exc


def read_image(path: Path) -> Any:
    """The image at ``path`` as an RGB Pillow image."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise InputError(f"--image {path}: no such file", fix="give an image file (PNG, JPEG, ...)")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(f"--image {path} is not an image Pillow reads: {exc}", fix="give a PNG or JPEG") from exc


def image_prompts(processor: Any, prompts: list[str], images: list[Path]) -> dict[str, torch.Tensor]:
    """The model's inputs for prompts (text with the processor's image placeholder, one image each), left-padded as
    a decoder-only model's batch is."""
    if len(prompts) != len(images):
        raise InputError(
            f"{len(prompts)} prompt(s) and {len(images)} image(s): each prompt takes one image",
            fix="give one --prompt per --image, in the same order",
        )
    token = getattr(processor, "image_token", None)
    if token and not all(token in text for text in prompts):
        raise InputError(
            f"a prompt lacks the image placeholder {token!r}: the processor puts the image's tokens there",
            fix=f"write {token!r} where the image goes, e.g. --prompt 'USER: {token} What is shown? ASSISTANT:'",
        )
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is not None:
        tokenizer.padding_side = "left"
    made = processor(text=prompts, images=[read_image(path) for path in images], return_tensors="pt", padding=True)
    return {name: torch.as_tensor(value) for name, value in made.items()}
