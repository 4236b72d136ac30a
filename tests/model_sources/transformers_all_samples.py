"""The sample search of the every-type source (:mod:`model_sources.transformers_all_models`): the inputs a model's
``forward`` names, filled from its config (:func:`candidate_samples`: token ids, an image with as many placeholder
tokens as its features, an image the text cross-attends to, speech features in the layouts transformers' speech models
take, a waveform, token boxes), likeliest first."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from model_sources import image, seeded, token_ids
from model_sources.transformers_all_config import (
    TOKENS,
    first_attribute,
    free_token,
    image_side,
    placeholder_names,
    side_of,
)
from model_sources.transformers_all_images import image_layouts, patches_with_positions, required_ids

#: Config attributes that state how many placeholder tokens an image takes (Gemma 3's 256 per image, PaliGemma's and
#: Chameleon's sequence length, BLIP-2's query tokens), tried before the counts read from the vision tower's grid.
DECLARED_IMAGE_TOKENS = (
    "mm_tokens_per_image",
    "image_seq_length",
    "num_image_tokens",
    "image_token_count",
    "tokens_per_image",
    "num_query_tokens",
)


def candidate_samples(model: torch.nn.Module, config: Any) -> list[dict[str, Any]]:
    """The samples to try, in order: the inputs the model's ``forward`` names, filled from its config."""
    parameters = inspect.signature(model.forward).parameters
    main = str(getattr(model, "main_input_name", "input_ids"))
    vocabulary = int(first_attribute(config, "vocab_size", default=128) or 128)
    ids = token_ids(TOKENS, high=max(4, min(100, vocabulary)))
    text: dict[str, Any] = {"input_ids": ids}
    if "attention_mask" in parameters:
        text["attention_mask"] = torch.ones_like(ids)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in parameters:
        text["decoder_input_ids"] = token_ids(4, high=max(4, min(100, vocabulary)))
    decoder = {k: v for k, v in text.items() if k == "decoder_input_ids"}
    channels = int(first_attribute(config, "num_channels", "in_channels", "num_input_channels", default=3) or 3)
    side = image_side(config)
    pixels = image(side, channels)
    mels = int(first_attribute(config, "num_mel_bins", "feature_size", "input_feat_per_channel", default=16) or 16)
    positions = int(first_attribute(config, "max_source_positions", default=16) or 16)
    frames = first_attribute(config, "max_length", default=None)
    candidates: list[dict[str, Any]] = []
    if main == "pixel_values" or ("pixel_values" in parameters and "input_ids" not in parameters):
        candidates.append({"pixel_values": pixels, **decoder})
    if main == "flattened_patches":  # the image as patches, each after its row and column (Pix2Struct's processor)
        patches = patches_with_positions(pixels, side_of(first_attribute(config, "patch_size", default=8) or 8))
        over = {"attention_mask": torch.ones(patches.shape[:2], dtype=torch.long)}
        candidates.append({"flattened_patches": patches, **(over if "attention_mask" in parameters else {}), **decoder})
    if "input_ids" in parameters and ("pixel_values" in parameters or "flattened_patches" in parameters):
        placeholders = [getattr(config, name, None) for name in placeholder_names(config)]
        placeholder = next((token for token in placeholders if token is not None), None)
        # a mask of the tokens the image's features replace, in place of a placeholder id (Kosmos-2's
        # ``image_embeds_position_mask``): the image's tokens are a marker id the text does not draw
        image_positions = [name for name in parameters if name.endswith("position_mask")]
        if placeholder is None and image_positions:
            placeholder = free_token(config, None)
        if placeholder is None:
            candidates.append({**text, "pixel_values": pixels})
        else:  # a placeholder token per image feature: as many as the vision tower's plausible feature counts
            patch = side_of(first_attribute(config, "patch_size", default=8) or 8)
            grid = max(1, side // patch)
            declared = [first_attribute(config, name) for name in DECLARED_IMAGE_TOKENS]
            declared = [int(count) for count in declared if isinstance(count, int) and 0 < count <= 4096]
            for images, measured in image_layouts(model, config, pixels, parameters):
                counts = (*measured, *declared, grid * grid, grid * grid + 1, max(1, grid // 2) ** 2, 1)
                for count in dict.fromkeys(counts):
                    with_image = torch.cat([torch.full((1, count), int(placeholder)), ids], dim=1)
                    mask = {"attention_mask": torch.ones_like(with_image)} if "attention_mask" in parameters else {}
                    if "mm_token_type_ids" in parameters:  # which tokens are image tokens (M-RoPE's positions)
                        mask["mm_token_type_ids"] = (with_image == int(placeholder)).to(torch.int32)
                    mask.update({name: with_image == int(placeholder) for name in image_positions})
                    candidates.append({**text, "input_ids": with_image, **mask, **images})
        candidates += _cross_attended_images(config, text, pixels, parameters)
    if main == "input_features" or "input_features" in parameters:
        for layout in ((1, mels, 2 * positions), (1, 2 * positions, mels), (1, 64, mels), (1, mels, 64)):
            candidates.append({"input_features": torch.randn(*layout, generator=seeded()), **decoder})
    if main == "input_values" or "input_values" in parameters:
        candidates.append({"input_values": torch.randn(1, 1600, generator=seeded()), **decoder})
        if frames:
            candidates.append({"input_values": torch.randn(1, int(frames), mels, generator=seeded())})
    if "input_ids" in parameters:
        candidates.append(text)
    if not candidates:
        candidates.append({main: ids})
    if "bbox" in parameters:  # last: each token's box [x0, y0, x1, y1] in [0, 1] (UDOP's; LayoutLM's run without)
        boxes = [{**c, "bbox": _token_boxes(c["input_ids"])} for c in candidates if "input_ids" in c]
        candidates += boxes
    required = required_ids(parameters, ids)
    return [{**candidate, **required} for candidate in candidates]


def _token_boxes(ids: torch.Tensor) -> torch.Tensor:
    """A box per token [1, tokens, 4] (left, top, right, bottom in [0, 1]): the tokens in a row across the page."""
    count = ids.shape[1]
    left = torch.arange(count, dtype=torch.float32) / count
    top = torch.full((count,), 0.25)
    return torch.stack([left, top, left + 1 / count, top + 0.1], dim=-1)[None]


def _cross_attended_images(
    config: Any, text: dict[str, torch.Tensor], pixels: torch.Tensor, parameters: Any
) -> list[dict[str, torch.Tensor]]:
    """The image for a model whose text cross-attends to it (placeholder tokens, if any, are not counted): as images
    [1, images, C, H, W] (IDEFICS's) and as images of tiles [1, images, tiles, C, H, W], as many tiles as the config's
    ``max_num_tiles`` (Mllama's, padded to 4 as its processor pads them), with the inputs the forward names for them:
    which tokens see which image (``image_attention_mask``, ``cross_attention_mask``: every token sees the image's
    first tile) and the image's tiling (``aspect_ratio_ids``: 1, the first of the config's ratios, one tile;
    ``aspect_ratio_mask``: its first tile). None for a model whose forward names neither."""
    masks = [n for n in parameters if n.endswith("attention_mask") and ("image" in n or "cross" in n)]
    if not masks and "aspect_ratio_ids" not in parameters:
        return []
    length = text["input_ids"].shape[1]
    tiles = int(first_attribute(config, "max_num_tiles", default=1) or 1)
    first = torch.zeros(1, 1, tiles, dtype=torch.long)
    first[..., 0] = 1
    found = []
    for images in (pixels[:, None], pixels[:, None, None].expand(-1, -1, tiles, -1, -1, -1).clone()):
        inputs = {**text, "pixel_values": images}
        layout = images.shape[1:-3]  # images, tiles
        seen = first if len(layout) > 1 else torch.ones(1, 1, dtype=torch.long)
        inputs.update({name: seen[:, None].expand(1, length, *layout).clone() for name in masks})
        if "aspect_ratio_ids" in parameters:
            inputs["aspect_ratio_ids"] = torch.ones(1, layout[0], dtype=torch.long)
        if "aspect_ratio_mask" in parameters and len(layout) > 1:
            inputs["aspect_ratio_mask"] = first.clone()
        found.append(inputs)
    return found
