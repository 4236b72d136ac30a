"""The repairs a small model's forward asks for in its error, for the every-type source's build
(:mod:`model_sources.transformers_all_models`): M-RoPE sections that do not fit the small head or that the config
leaves unset, a token id the code reads from a config class that lacks it, a prompt with another count of image
placeholders than the model made features (:func:`recounted_sample`), and a width a layer is fed that the config
states apart from the shrunk sizes (:func:`width_repair`)."""

from __future__ import annotations

import re
from typing import Any

import torch

from model_sources.transformers_all_config import configs, placeholder_names
from model_sources.transformers_models import SMALL

#: transformers' error for M-RoPE sections a model's code defaults to (GLM-4V's 8 + 12 + 12) that the head does not fit.
SECTIONS_ERROR = re.compile(r"split_sizes to sum exactly to (\d+) .*but got split_sizes=\[([\d, ]+)\]")

#: A model's error for M-RoPE sections its config leaves to the checkpoint (HunYuan-VL's, none by default).
NO_SECTIONS_ERROR = re.compile(r"expects at least (\d+) multimodal RoPE axes, got 0")

#: A token id the model's code reads from a config class that does not define it (Qwen2.5-Omni's thinker reads
#: ``vision_start_token_id``, which only the whole Omni model's config has).
MISSING_TOKEN_ERROR = re.compile(r"'(\w+)' object has no attribute '(\w+_token_(?:id|index))'")


#: transformers' check that a prompt holds one placeholder per image feature.
COUNT_ERROR = re.compile(r"features and image tokens do not match,? tokens: (\d+), features: (\d+)")


def recounted_sample(config: Any, sample: dict[str, Any], message: str) -> dict[str, Any] | None:
    """The sample with as many image placeholders as the model's own count check says it made features (Granite 4
    Vision's, whose ``get_image_features`` returns its features by decoder layer, not counted beforehand), its per-token
    inputs made again from the new prompt; None for another error, or a sample without placeholders."""
    found = COUNT_ERROR.search(message)
    placeholder = next((getattr(config, n) for n in placeholder_names(config) if getattr(config, n, None)), None)
    if found is None or placeholder is None or "input_ids" not in sample or found[1] == found[2]:
        return None
    ids = sample["input_ids"]
    text = ids[ids != placeholder].reshape(1, -1)
    if text.shape[1] == ids.shape[1] or not 0 < int(found[2]) <= 4096:
        return None
    prompt = torch.cat([torch.full((1, int(found[2])), int(placeholder)), text], dim=1)
    recounted = {**sample, "input_ids": prompt}
    for name, value in sample.items():
        if name != "input_ids" and isinstance(value, torch.Tensor) and value.shape == ids.shape:
            marks = torch.ones_like(prompt) if name == "attention_mask" else prompt == int(placeholder)
            recounted[name] = marks.to(value.dtype)
    return recounted


#: PyTorch's error for a linear layer fed another width than its weight's.
MATMUL_ERROR = re.compile(r"mat1 and mat2 shapes cannot be multiplied \(\d+x(\d+) and (\d+)x(\d+)\)")


def width_repair(config: Any, message: str) -> dict[tuple[str, str], int] | None:
    """The one config size (``_dim``, ``_size``) that a linear layer fed another width says is not the width it is
    fed: a width the config states apart from the sizes it derives from, which the shrink left at its default
    (Mllama's ``vision_output_dim``, 7680: its tower's width times its feature layers and one). None unless exactly
    one size of the config and its sub-configs holds the expected width, or exactly one of the sub-configs that also
    state the layer's output width (Llama 4's tower ``intermediate_size``, the width its pixel shuffle makes 4 x the
    tower's, beside its ``projector_input_dim``, the layer's output; the text model's ``intermediate_size`` has the
    same small value)."""
    found = MATMUL_ERROR.search(message)
    if found is None or found[1] == found[2]:
        return None
    fed, expected, output = int(found[1]), int(found[2]), int(found[3])

    def sizes(owner: Any) -> dict[str, Any]:
        return {n: v for n, v in vars(owner).items() if n.endswith(("_dim", "_size")) and not isinstance(v, bool)}

    holders = [(owner, name) for owner in configs(config) for name, value in sizes(owner).items() if value == expected]
    if len(holders) > 1:  # the layer's own config states its output width too
        holders = [(owner, name) for owner, name in holders if output in sizes(owner).values()]
    if len(holders) > 1:  # a width stated apart, not one of the shrink's sizes (Muse Spark's ``out_hidden_size``)
        holders = [(owner, name) for owner, name in holders if name not in SMALL] or holders
    return {(type(holders[0][0]).__name__, holders[0][1]): fed} if len(holders) == 1 else None
