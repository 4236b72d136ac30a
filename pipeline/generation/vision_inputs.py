"""What a vision-language generation sample holds: its text inputs (the prompts, their mask, token types and the
model's own per-token inputs such as M-RoPE's ``mm_token_type_ids``) and its image inputs, and whether a model and
sample take the vision-language path at all (:mod:`pipeline.generation.vision_language`)."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from converters.errors import InputError
from pipeline.runtime.generation.image_positions import image_rows
from pipeline.runtime.generation.vision_feed import TOKEN_TYPES
from pipeline.runtime.io_spec import normalise_sample

#: The text inputs of the sample; every other tensor is an input of the vision graph (one row per image).
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def is_vision_language(model: Any, sample: Any) -> bool:
    """Whether ``model`` is a transformers image-text-to-text decoder (it has ``get_image_features`` and its forward
    takes ``pixel_values``) and ``sample`` holds ``pixel_values``: without images, its text decoder converts as a
    causal LM's step."""
    features = image_features_method(model)
    forward = getattr(model, "forward", None)
    if features is None or not callable(forward):
        return False
    args, kwargs = normalise_sample(sample)
    given = dict(args[0]) if len(args) == 1 and isinstance(args[0], dict) and not kwargs else kwargs
    if "pixel_values" not in given:
        return False
    try:
        return "pixel_values" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def image_features_method(model: Any) -> Any:
    """``model.get_image_features``, or its base model's (``model.model``: Janus and DeepSeek-VL have it there only);
    for a generative model with neither whose ``pixel_values`` are a video's frames (InstructBLIP-Video), its
    ``get_video_features``; None when it has none of them."""
    for name in features_method_names(model):
        for owner in (model, getattr(model, "model", None)):
            method = getattr(owner, name, None)
            if callable(method):
                return method
    return None


def features_method_names(model: Any) -> tuple[str, ...]:
    """The name of the method giving the model's image features (none, or one): ``get_image_features``, else
    ``get_video_features`` for a generative model (``can_generate``)."""
    owners = (model, getattr(model, "model", None))
    if any(callable(getattr(owner, "get_image_features", None)) for owner in owners):
        return ("get_image_features",)
    can_generate = getattr(model, "can_generate", None)
    return ("get_video_features",) if callable(can_generate) and can_generate() else ()


def takes_video_frames(model: Any) -> bool:
    """Whether the model's image features are its video's (:func:`features_method_names`): its placeholder is then
    its config's video token."""
    return features_method_names(model) == ("get_video_features",)


def image_input_names(model: torch.nn.Module) -> list[str]:
    """The inputs ``model.get_image_features`` takes by name, in its order; where it passes ``**kwargs`` on to its
    inner model's (Video-LLaMA 3's ``image_merge_sizes``), that one's named inputs after them."""
    names: list[str] = []
    owners = [model, getattr(model, "model", None)]
    method_name = next(iter(features_method_names(model)), "get_image_features")
    for owner in owners:
        method = getattr(owner, method_name, None)
        if not callable(method):
            if names or owner is not model:
                break
            continue  # the base model's alone (Janus)
        parameters = inspect.signature(method).parameters.values()
        names += [p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return names


def sample_inputs(model: torch.nn.Module, sample: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The sample's text inputs (``input_ids``, ``attention_mask``) and its vision inputs (every other tensor, in the
    order ``get_image_features`` takes them, ``pixel_values`` first)."""
    args, kwargs = normalise_sample(sample)
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        kwargs, args = dict(args[0]), ()
    if args or not isinstance(kwargs.get("input_ids"), torch.Tensor) or "pixel_values" not in kwargs:
        raise InputError(
            f"the generation sample of a vision-language model ({type(model).__name__}) is a dict of its processor's "
            "tensors with input_ids and pixel_values",
            fix='pass pipeline.convert(model, {"input_ids": ..., "attention_mask": ..., "pixel_values": ...}, '
            "generation={...})",
        )
    not_tensors = sorted(name for name, value in kwargs.items() if not isinstance(value, torch.Tensor))
    if not_tensors:
        raise InputError(
            f"the generation sample's {', '.join(not_tensors)} are not tensors",
            fix="pass tensors only (the processor's return_tensors='pt' output)",
        )
    ids = kwargs["input_ids"]
    if ids.dim() != 2 or ids.is_floating_point():
        raise InputError(
            "the sample's input_ids must be token ids [batch, tokens]", fix="pass the processor's input_ids"
        )
    mask = kwargs.get("attention_mask", torch.ones_like(ids))
    text = {"input_ids": ids.to(torch.int64), "attention_mask": mask.to(torch.int64)}
    if TOKEN_TYPES in kwargs:
        types = kwargs[TOKEN_TYPES]
        if TOKEN_TYPES not in inspect.signature(model.forward).parameters or types.shape != ids.shape:
            raise InputError(
                f"the generation sample's token_type_ids ({list(types.shape)}) are not {type(model).__name__}'s: its "
                "forward takes none, or they are not one per token of input_ids",
                fix="pass the processor's token_type_ids with its input_ids, or leave them out",
            )
        text[TOKEN_TYPES] = types.to(torch.int64)
    taken = image_input_names(model)
    for name, value in kwargs.items():  # per-token inputs of the model's own (M-RoPE's mm_token_type_ids)
        if name not in (*TEXT_INPUTS, *taken) and value.shape == ids.shape and not value.is_floating_point():
            text[name] = value
    others = [name for name in kwargs if name not in (*TEXT_INPUTS, *text)]
    refused = sorted(name for name in others if name not in taken)
    if refused:
        raise InputError(
            f"the generation sample holds {', '.join(refused)}, which {type(model).__name__}.get_image_features does "
            "not take",
            fix=f"pass input_ids, attention_mask and the image inputs ({', '.join(taken)})",
        )
    vision = {name: kwargs[name] for name in sorted(others, key=taken.index)}
    image_rows(vision)  # one image per leading row, or flattened patches a grid divides: else said here
    return text, vision
