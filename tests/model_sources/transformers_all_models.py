"""transformers, every model type: each type of ``CONFIG_MAPPING`` from one generic shrinker, read from transformers.

Nothing here lists architectures. For every model type the library names, the cases are its base model
(``MODEL_MAPPING_NAMES``) and the first head of :data:`HEADS` it has (the head users deploy: causal LM, seq2seq LM,
speech recognition, image-text-to-text, image classification, CTC, audio classification), built from
:func:`~model_sources.transformers_models.shrunk_config` (every size in ``SMALL`` the config takes, sub-configs
included) plus :data:`OVERRIDES` where a type needs one, each with its reason. The sample is found, not declared:
:func:`candidate_samples` proposes the inputs the model's ``forward`` names (token ids, an image at the config's size,
speech features in the layouts transformers' speech models take, a waveform), and the first candidate the model runs
eagerly is the sample. A type whose config cannot be built, or that runs on none of the candidates, is PyTorch's
outcome in the table (``pytorch``, not counted), with its error.

Families (:func:`family_of`) are read from the config and the mappings: ``encoder-decoder``, ``multimodal``,
``moe``, ``state-space``, ``audio``, ``vision``, ``decoder``, ``encoder``, and ``other`` (a type in none of the
mappings that say: sub-models, time series, reinforcement learning).

The work is split by what it does; every name the tests and benchmarks use is importable from here:
:mod:`~model_sources.transformers_all_shrink` (the shrinker, its variants and overrides),
:mod:`~model_sources.transformers_all_fitting` (the sizes a shrunk config derives, fitted),
:mod:`~model_sources.transformers_all_config` (reading a config),
:mod:`~model_sources.transformers_all_samples` and :mod:`~model_sources.transformers_all_images` (the sample
search), :mod:`~model_sources.transformers_all_build` and :mod:`~model_sources.transformers_all_repairs` (building
with the repairs the errors ask for).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from model_sources import ModelCase
from model_sources.transformers_all_build import (
    MAX_PARAMETERS,
    UngroupedKeys,
    build,
    open_gates,
    redraw_constant_matrices,
)
from model_sources.transformers_all_config import (
    SPECIAL_TOKENS,
    TOKENS,
    VIDEO_TOKENS,
    first_attribute,
    free_token,
    modeling_auto,
)
from model_sources.transformers_all_fitting import FEATURE_LAYERS, TIMM_CHANNELS, WIDEST_STAGE
from model_sources.transformers_all_images import joined_images
from model_sources.transformers_all_repairs import (
    COUNT_ERROR,
    MATMUL_ERROR,
    MISSING_TOKEN_ERROR,
    NO_SECTIONS_ERROR,
    SECTIONS_ERROR,
    width_repair,
)
from model_sources.transformers_all_samples import DECLARED_IMAGE_TOKENS, candidate_samples
from model_sources.transformers_all_shrink import OVERRIDES, TOWER, VARIANTS, shrunk, tied_size

__all__ = [
    "build",
    "candidate_samples",
    "cases",
    "families",
    "family_of",
    "free_token",
    "joined_images",
    "model_classes",
    "model_types",
    "open_gates",
    "redraw_constant_matrices",
    "shrunk",
    "tied_size",
    "width_repair",
    "COUNT_ERROR",
    "DECLARED_IMAGE_TOKENS",
    "FAMILIES",
    "FEATURE_LAYERS",
    "HEADS",
    "MATMUL_ERROR",
    "MAX_PARAMETERS",
    "MISSING_TOKEN_ERROR",
    "ModelCase",
    "NO_SECTIONS_ERROR",
    "OVERRIDES",
    "SECTIONS_ERROR",
    "SPECIAL_TOKENS",
    "TIMM_CHANNELS",
    "TOKENS",
    "TOWER",
    "UngroupedKeys",
    "VARIANTS",
    "VIDEO_TOKENS",
    "WIDEST_STAGE",
]


#: (label, mapping name in ``transformers.models.auto.modeling_auto``): the heads tried after the base model, first
#: found wins.
HEADS = (
    # an encoder-decoder's deployed head is its seq2seq one (BART and Whisper also have a decoder-only causal LM)
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("image-text-to-text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("ctc", "MODEL_FOR_CTC_MAPPING_NAMES"),
    ("audio-classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"),
)


def model_types() -> list[str]:
    """Every model type transformers' ``CONFIG_MAPPING`` names, sorted."""
    return sorted(modeling_auto().CONFIG_MAPPING_NAMES)


def _class_name(names: Any) -> str | None:
    """The class a mapping names (some map a type to several: the first)."""
    if isinstance(names, (list, tuple)):
        return str(names[0]) if names else None
    return str(names) if names else None


def model_classes(model_type: str) -> list[tuple[str, str]]:
    """``(label, class name)`` of the type's base model and of the first head of :data:`HEADS` it has."""
    auto = modeling_auto()
    found = []
    base = _class_name(auto.MODEL_MAPPING_NAMES.get(model_type)) or _model_of_config(model_type)
    if base:
        found.append(("base", base))
    for label, mapping in HEADS:
        head = _class_name(getattr(auto, mapping, {}).get(model_type))
        if head and head != base:
            found.append((label, head))
            break
    return found


def _model_of_config(model_type: str) -> str | None:
    """A model class for a type the auto mappings leave out (a sub-model's config, ``BlipVisionConfig``): the class
    its config's name gives (``BlipVisionModel``), when transformers has it."""
    import transformers

    config = modeling_auto().CONFIG_MAPPING_NAMES.get(model_type, "")
    name = config[: -len("Config")] + "Model" if config.endswith("Config") else ""
    return name if name and hasattr(transformers, name) else None


def family_of(model_type: str) -> str:
    """The type's family, read from its config class's defaults and transformers' mappings."""
    auto = modeling_auto()
    try:
        config = shrunk(model_type)
    except Exception:  # noqa: BLE001 - a config that cannot be built is listed under the family of its mappings
        config = None
    if config is not None and getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if model_type in auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES or model_type in getattr(
        auto, "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES", {}
    ):
        return "multimodal"
    if config is not None:
        subs = {name for name in ("vision_config", "text_config", "audio_config") if getattr(config, name, None)}
        if len(subs) >= 2:
            return "multimodal"
        if any(first_attribute(config, name) for name in ("num_experts", "num_local_experts", "n_routed_experts")):
            return "moe"
        if first_attribute(config, "state_size", "ssm_state_size", "mamba_d_state", "d_state") is not None:
            return "state-space"

    def in_mappings(*words: str) -> bool:
        names = [n for n in dir(auto) if n.startswith("MODEL_FOR_") and n.endswith("_MAPPING_NAMES")]
        return any(model_type in getattr(auto, n) for n in names if any(word in n for word in words))

    if in_mappings("AUDIO", "CTC", "SPEECH", "WAVEFORM", "SPECTROGRAM") or any(
        word in model_type for word in ("audio", "speech", "wav")
    ):
        return "audio"
    pixels = ("IMAGE", "OBJECT", "SEGMENTATION", "DEPTH", "KEYPOINT", "VIDEO", "MASK_GENERATION", "BACKBONE", "POSE")
    if in_mappings(*pixels) or "vision" in model_type or model_type.endswith(("_vit", "vit")):
        return "vision"
    if model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "decoder"
    if in_mappings("MASKED_LM", "SEQUENCE_CLASSIFICATION", "TOKEN_CLASSIFICATION", "QUESTION_ANSWER", "TEXT_ENCODING"):
        return "encoder"
    return "other"


#: The families :func:`family_of` found, by model type (it builds each type's config: half a minute for all of them,
#: in every worker process of a coverage run). A type missing here (a newer transformers) is classified on the spot.
FAMILIES = Path(__file__).with_name("transformers_all_families.json")


def families() -> dict[str, str]:
    """:data:`FAMILIES`' table."""
    return json.loads(FAMILIES.read_text()) if FAMILIES.exists() else {}


def cases() -> list[ModelCase]:
    """One case per model type and class (base, head); a type with no model class is one case that says so."""
    found = []
    known = families()
    for model_type in model_types():
        classes = model_classes(model_type)
        family = known.get(model_type) or family_of(model_type)
        if not classes:
            found.append(ModelCase("transformers_all", model_type, family, lambda t=model_type: _no_model(t)))
        for label, class_name in classes:
            name = model_type if label == "base" else f"{model_type}:{label}"
            found.append(ModelCase("transformers_all", name, family, lambda t=model_type, c=class_name: build(t, c)))
    return found


def _no_model(model_type: str) -> tuple[torch.nn.Module, Any]:
    raise RuntimeError(f"{model_type} has a config but no model class in transformers' auto mappings")


if __name__ == "__main__":  # python tests/model_sources/transformers_all_models.py: write FAMILIES again
    import logging

    logging.disable(logging.WARNING)
    table = {model_type: family_of(model_type) for model_type in model_types()}
    FAMILIES.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(table)} model types -> {FAMILIES}")
