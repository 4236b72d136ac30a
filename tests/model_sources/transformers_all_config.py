"""Reading a transformers config for the every-type source (:mod:`model_sources.transformers_all_models`): transformers'
auto mappings, a config with its sub-configs, the first of several attribute names it has, an image's side, the
placeholder tokens a multimodal model replaces with its features, and a token id free for a marker."""

from __future__ import annotations

from typing import Any

#: Token ids stay below this (and below the vocabulary), image-token ids and special ids above it are not drawn.
TOKENS = 8


def modeling_auto() -> Any:
    """transformers' auto mappings (``transformers.models.auto.modeling_auto``), imported after the tests'
    environment."""
    import tests_environment  # noqa: F401 -- torchvision's operator schemas: transformers' vision models import it
    from transformers.models.auto import modeling_auto as auto

    return auto


def configs(config: Any) -> list[Any]:
    """The config and its sub-configs (one level)."""
    from transformers import PretrainedConfig

    return [config] + [value for value in vars(config).values() if isinstance(value, PretrainedConfig)]


#: Token ids of placeholders a multimodal model replaces with its image or audio features.
SPECIAL_TOKENS = ("image_token_id", "image_token_index", "video_token_id", "audio_token_id", "audio_token_index")


#: The placeholder of a model whose images are a video's frames (InstructBLIP-Video's ``video_token_index``).
VIDEO_TOKENS = ("video_token_id", "video_token_index")


def placeholder_names(config: Any) -> tuple[str, ...]:
    """The config's names of the token an image's features replace: its image token's, else its video token's (a
    model that takes its frames as ``pixel_values``)."""
    images = tuple(name for name in SPECIAL_TOKENS[:2] if name in vars(config))
    return images or tuple(name for name in VIDEO_TOKENS if name in vars(config)) or SPECIAL_TOKENS[:2]


def first_attribute(config: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` the config (or its vision, audio, encoder or text sub-config) has."""
    owners = [config] + [
        getattr(config, sub, None) for sub in ("vision_config", "audio_config", "encoder_config", "text_config")
    ]
    for owner in owners:
        for name in names:
            value = getattr(owner, name, None) if owner is not None else None
            if value is not None:
                return value
    return default


def image_side(config: Any) -> int:
    """The side of the config's image (its own, else its sub-configs'; 32 when none states one)."""
    return side_of(first_attribute(config, "image_size", "input_size", default=32))


def side_of(size: Any) -> int:
    """One side of a size given as a number, a pair (InternVL's ``(14, 14)`` patches) or a dict with a height."""
    if isinstance(size, dict):
        size = size.get("height", 32)
    return int(size[0] if isinstance(size, (list, tuple)) else size)


def free_token(config: Any, taken: dict[Any, int] | None) -> int:
    """The highest token id below the vocabulary that no token id of the config (nor ``taken``) is: a marker token
    the sample's text does not draw (its ids stay below 100)."""
    vocabulary = int(first_attribute(config, "vocab_size", default=128) or 128)
    used = set((taken or {}).values())
    for owner in configs(config):
        used |= {v for n, v in vars(owner).items() if n.endswith(("_token_id", "_token_index")) and isinstance(v, int)}
    return next(token for token in range(vocabulary - 1, 2, -1) if token not in used)
