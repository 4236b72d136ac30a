"""``pipeline generate DIR --image FILE --prompt TEXT --processor DIR``: a vision-language model's prompts and images
through its own processor (``AutoProcessor.from_pretrained``, offline), which writes the image placeholder tokens,
the per-token inputs that place the images or say which tokens see them (Kosmos-2's ``image_embeds_position_mask``,
Mllama's ``cross_attention_mask``, IDEFICS's ``image_attention_mask``) and the pixel inputs the model was trained on.
A processor with an image placeholder (``processor.image_token``) puts the image where each prompt holds it; one
without (Kosmos-2's, IDEFICS's) puts it before the prompt's text, as its own ``processor(text=..., images=...)`` does.
Images are read with Pillow (any format it opens), as RGB.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import InputError

if TYPE_CHECKING:
    import torch

#: The image placeholder most processors write; one without a placeholder of its own (IDEFICS's, Kosmos-2's) has an
#: image token of that text, which a prompt must not hold.
PLACEHOLDER = "<image>"


def load_processor(directory: Path) -> Any:
    """The model's processor from a local directory (offline)."""
    try:
        from transformers import AutoProcessor
    except ImportError as exc:  # transformers' image utilities import torchvision when it is installed
        cause = exc.__cause__ or exc
        raise InputError(
            f"--processor {directory}: transformers' processors do not import here ({type(cause).__name__}: "
            f"{' '.join(str(cause).split())[:200]})",
            fix="repair the environment's transformers and torchvision (pip install -U torchvision, matching torch), "
            "or uninstall torchvision",
        ) from exc
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


def image_prompts(
    processor: Any, prompts: list[str], images: list[Path], padding_side: str = "left"
) -> dict[str, torch.Tensor]:
    """The model's inputs for prompts (text with the processor's image placeholder, one image each), left-padded as
    a decoder-only model's batch is (``padding_side="right"``: an encoder's source). A processor that has a placeholder
    but puts each image's tokens before the text itself (Florence-2's) takes prompts without it: the prompts' image
    tokens are counted after processing."""
    import torch

    if len(prompts) != len(images):
        raise InputError(
            f"{len(prompts)} prompt(s) and {len(images)} image(s): each prompt takes one image",
            fix="give one --prompt per --image, in the same order",
        )
    token = getattr(processor, "image_token", None)
    lacking = InputError(
        f"a prompt lacks the image placeholder {token!r}: the processor puts the image's tokens there",
        fix=f"write {token!r} where the image goes, e.g. --prompt 'USER: {token} What is shown? ASSISTANT:'",
    )
    missing = isinstance(token, str) and bool(token) and not all(token in text for text in prompts)
    if not token and any(PLACEHOLDER in text for text in prompts):
        raise InputError(
            f"a prompt holds {PLACEHOLDER!r}, but {type(processor).__name__} has no image placeholder: it puts each "
            "image before its prompt's text itself (the text's own image token would be one image too many)",
            fix=f"write the prompt without {PLACEHOLDER!r}, e.g. --prompt 'What is shown?'",
        )
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is not None:
        tokenizer.padding_side = padding_side
    pictures = [read_image(path) for path in images]
    try:
        made = _processed(processor, prompts, pictures)
    except InputError:
        if missing:
            raise lacking from None
        raise
    if missing and not _every_row_holds(made, getattr(processor, "image_token_id", None)):
        raise lacking
    return {name: torch.as_tensor(value) for name, value in made.items()}


def _processed(processor: Any, prompts: list[str], pictures: list[Any]) -> Any:
    """The processor's output for the prompts and their images; an InputError when it refuses them."""
    try:
        return processor(text=prompts, images=pictures, return_tensors="pt", padding=True)
    except (ValueError, TypeError) as flat:
        # a processor that takes each prompt's images as a list of their own (Mllama's) counts a flat list of
        # several images as one prompt's
        try:
            nested = [[picture] for picture in pictures]
            return processor(text=prompts, images=nested, return_tensors="pt", padding=True)
        except (ValueError, TypeError):
            raise InputError(
                f"--processor {type(processor).__name__} refuses the prompts and images: "
                f"{' '.join(str(flat).split())[:300]}",
                fix="write each --prompt as the model's processor expects it (with its image placeholder, if it has "
                "one), one --image each",
            ) from flat


def _every_row_holds(made: Any, token_id: Any) -> bool:
    """Whether every prompt the processor made holds the image token (it placed the images itself)."""
    import torch

    ids = made.get("input_ids") if hasattr(made, "get") else None
    if not isinstance(token_id, int) or ids is None:
        return False
    return bool((torch.as_tensor(ids) == token_id).any(dim=-1).all())
