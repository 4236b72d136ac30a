"""What a vision-language generation sample holds: its text inputs (the prompts, their mask, token types and the
model's own per-token inputs such as M-RoPE's ``mm_token_type_ids``) and its image inputs, and whether a model and
sample take the vision-language path at all (:mod:`pipeline.generation.vision_language`).

The path is the same for every modality whose features a decoder-only LM places at placeholder tokens: images
(``get_image_features`` on ``pixel_values``, placed at the config's image token) and audio (``get_audio_features`` on
``input_features``, placed at its audio token: Voxtral, GLM-ASR, Audio Flamingo 3, ...). The sample's main input says
which (:func:`modality_of`); "image" in the names below is one item of a modality's features (an image, an audio)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable
from typing import Any

import torch

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.audio_features import features_in_forward, find_features
from pipeline.generation.handed_features import handed_as_in_forward
from pipeline.generation.prompt_features import check_own_prompt, own_prompt_features
from pipeline.runtime.generation.image_positions import image_rows
from pipeline.runtime.generation.vision_feed import TOKEN_TYPES
from pipeline.runtime.generation.vision_language import MAIN_INPUTS
from pipeline.runtime.io_spec import normalise_sample

#: The text inputs of the sample; every other tensor is an input of the vision graph (one row per image).
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclasses.dataclass(frozen=True)
class Modality:
    """What features a decoder-only LM places at its placeholder tokens: ``name`` (the config's ``{name}_token_id``
    or ``{name}_token_index`` names the token), the sample's inputs that may hold them (``main_inputs``: one of them),
    and the model's method giving them."""

    name: str
    main_inputs: tuple[str, ...]
    method: str

    def main_input(self, names: Iterable[str]) -> str:
        """The one of :attr:`main_inputs` among ``names`` (the first one when none is)."""
        given = set(names)
        return next((name for name in self.main_inputs if name in given), self.main_inputs[0])


#: Images as pixels, or as Pix2Struct's flattened patches beside the prompt (Kosmos-2.5's).
IMAGES = Modality("image", MAIN_INPUTS["image"], "get_image_features")
#: Audio as mel features (Voxtral's, GLM-ASR's) or as a waveform (OmniASR's ``input_values``).
AUDIO = Modality("audio", MAIN_INPUTS["audio"], "get_audio_features")
#: The config attributes naming the audio token.
AUDIO_TOKENS = ("audio_token_id", "audio_token_index")


def modality_of(names: Iterable[str]) -> Modality:
    """The modality of a sample (or one item's inputs) holding ``names``: audio when it holds ``input_features`` (or
    ``input_values``) and no ``pixel_values``, else images."""
    given = set(names)
    audio = any(name in given for name in AUDIO.main_inputs)
    return AUDIO if audio and not any(name in given for name in IMAGES.main_inputs) else IMAGES


def check_one_modality(model: Any, names: Iterable[str]) -> None:
    """An InputError when a sample holding ``names`` holds both images (``pixel_values``) and audio
    (``input_features``): one conversion places one modality's features (one features graph), and taking it as images
    would leave its audio unplaced. The error names each modality's inputs the sample holds (the main one and those
    its features method takes: Qwen Omni's ``image_grid_thw``, ``feature_attention_mask``)."""
    given = list(names)
    held = {}
    for modality in (IMAGES, AUDIO):
        if any(name in given for name in modality.main_inputs):
            taken = (*modality.main_inputs, *image_input_names(model, modality))
            held[modality.name] = [name for name in given if name in taken]
    if len(held) < 2:
        return
    image, audio = ", ".join(held[IMAGES.name]), ", ".join(held[AUDIO.name])
    raise InputError(
        f"the generation sample of {type(model).__name__} holds both images ({image}) and audio ({audio}): a "
        "conversion places one modality's features at its placeholder tokens (one features graph), and mixed "
        "modalities in one conversion are not supported",
        fix=f"convert once per modality: a sample without {audio} for the image module, one without {image} for the "
        "audio module (with that modality's placeholder tokens in its prompts); each module's generate takes its own",
    )


def is_vision_language(model: Any, sample: Any) -> bool:
    """Whether ``model`` is a transformers image-text-to-text decoder (it has ``get_image_features`` and its forward
    takes ``pixel_values``) and ``sample`` holds ``pixel_values``, or an audio-language decoder
    (``get_audio_features``, ``input_features``: :data:`AUDIO`) and ``sample`` holds ``input_features``: without
    them, its text decoder converts as a causal LM's step. An audio model without ``get_audio_features`` whose forward
    takes the audio has the method looked for in its forward on ``sample``
    (:func:`~pipeline.generation.audio_features.find_features`: Qwen2-Audio's)."""
    forward = getattr(model, "forward", None)
    args, kwargs = normalise_sample(sample)
    given = dict(args[0]) if len(args) == 1 and isinstance(args[0], dict) and not kwargs else kwargs
    modality = modality_of(given)
    main = modality.main_input(given)
    if main not in given or not callable(forward):
        return False
    check_one_modality(model, given)
    try:
        taken = main in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False
    if taken and image_features_method(model, modality) is None and modality is AUDIO:
        # a forward that computes its audio features itself (Qwen2-Audio's): the method found there, if it is
        config = getattr(model, "config", None)
        token = next((getattr(config, n) for n in AUDIO_TOKENS if isinstance(getattr(config, n, None), int)), None)
        find_features(model, given, main, token)
    return taken and image_features_method(model, modality) is not None


def image_features_method(model: Any, modality: Modality = IMAGES) -> Any:
    """``model.get_image_features``, or its base model's (``model.model``: Janus and DeepSeek-VL have it there only);
    for a generative model with neither whose ``pixel_values`` are a video's frames (InstructBLIP-Video), its
    ``get_video_features``; for :data:`AUDIO`, its ``get_audio_features``, else the method found in its forward
    (:mod:`pipeline.generation.audio_features`: Qwen2-Audio's); None when it has none of them. A method that also
    takes the prompt (MusicFlamingo's ``input_ids``) is given each item in a prompt of its own
    (:mod:`pipeline.generation.prompt_features`)."""
    for name in features_method_names(model, modality):
        for owner in (model, getattr(model, "model", None)):
            method = getattr(owner, name, None)
            if callable(method):  # called as the forward calls it (pipeline/generation/placement_check.py)
                return own_prompt_features(model, handed_as_in_forward(model, method), modality.name)
    return features_in_forward(model) if modality is AUDIO else None


def features_method_names(model: Any, modality: Modality = IMAGES) -> tuple[str, ...]:
    """The name of the method giving the model's features of ``modality`` (none, or one): its method
    (``get_image_features``), else, for images, ``get_video_features`` for a generative model (``can_generate``)."""
    owners = (model, getattr(model, "model", None))
    if any(callable(getattr(owner, modality.method, None)) for owner in owners):
        return (modality.method,)
    if modality is not IMAGES:
        return ()
    can_generate = getattr(model, "can_generate", None)
    return ("get_video_features",) if callable(can_generate) and can_generate() else ()


def takes_video_frames(model: Any, modality: Modality = IMAGES) -> bool:
    """Whether the model's image features are its video's (:func:`features_method_names`): its placeholder is then
    its config's video token."""
    return features_method_names(model, modality) == ("get_video_features",)


def image_input_names(model: torch.nn.Module, modality: Modality = IMAGES) -> list[str]:
    """The inputs ``model.get_image_features`` (the ``modality``'s method) takes by name, in its order; where it
    passes ``**kwargs`` on to its inner model's (Video-LLaMA 3's ``image_merge_sizes``), that one's named inputs after
    them."""
    found = features_in_forward(model) if modality is AUDIO and not features_method_names(model, modality) else None
    if found is not None:  # the method found in the forward (Qwen2-Audio's): its audio and per-audio inputs
        return [found.main, *found.per_audio]
    return list(features_parameters(model, modality))


def features_parameters(model: Any, modality: Modality = IMAGES) -> dict[str, inspect.Parameter]:
    """The named parameters of the model's ``modality`` method (:func:`features_method_names`), in its order; where it
    passes ``**kwargs`` on to its inner model's (VibeVoice-ASR's ``get_audio_features(*args, **kwargs)``), that one's
    after them (none for a method found in the forward)."""
    parameters: dict[str, inspect.Parameter] = {}
    method_name = next(iter(features_method_names(model, modality)), modality.method)
    for owner in (model, getattr(model, "model", None)):
        method = getattr(owner, method_name, None)
        if not callable(method):
            if parameters or owner is not model:
                break
            continue  # the base model's alone (Janus)
        try:
            found = inspect.signature(method).parameters.values()
        except (TypeError, ValueError):
            break
        for p in found:
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                parameters.setdefault(p.name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in found):
            break
    return parameters


#: The values a generation sample may hold beside tensors: scalars, fixed inputs of the model (:func:`fixed_inputs`).
FIXED_KINDS = (bool, int, float, str, type(None))


def fixed_inputs(model: Any, sample: Any) -> dict[str, Any]:
    """The sample's **fixed inputs**: its scalars (a bool, an int, a float, a string or None) whose name is a
    parameter of the model's ``forward`` (VibeVoice-ASR's ``sample=False``, which keeps its audio features from
    drawing noise). The conversion passes each to every call it makes that takes it (the features method, the model's
    ``generate`` when validating) and the converted module holds it (``generation.fixed_inputs``)."""
    args, kwargs = normalise_sample(sample)
    given = dict(args[0]) if len(args) == 1 and isinstance(args[0], dict) and not kwargs else kwargs
    try:
        forward = inspect.signature(model.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return {}
    return {name: value for name, value in given.items() if isinstance(value, FIXED_KINDS) and name in forward}


def features_options(model: Any, modality: Modality, fixed: dict[str, Any]) -> dict[str, Any]:
    """The ``fixed`` inputs (:func:`fixed_inputs`) the model's ``modality`` method takes by name (the others are the
    model's forward's alone)."""
    if not fixed:
        return {}
    taken = image_input_names(model, modality)
    return {name: value for name, value in fixed.items() if name in taken}


def check_features_alone(model: torch.nn.Module, modality: Modality) -> None:
    """An InputError when the model's features method needs an input of the prompt that an item's own prompt
    (:mod:`pipeline.generation.prompt_features`: its placeholder tokens, MusicFlamingo's ``input_ids``) does not make:
    the features graph runs on one item alone, before the prompt's step."""
    method = image_features_method(model, modality)
    try:
        parameters = list(inspect.signature(method).parameters.values()) if method is not None else []
    except (TypeError, ValueError):
        return
    needed = [p.name for p in parameters if p.name in TEXT_INPUTS and p.default is p.empty]
    if needed:
        raise InputError(
            f"{type(model).__name__}.{modality.method} takes {', '.join(needed)}: its {modality.name} features depend "
            f"on the prompt, while the features graph gives one {modality.name}'s features alone, before the prompt's "
            "cached step",
            fix=PLAIN_FORWARD,
        )


def sample_inputs(model: torch.nn.Module, sample: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The sample's text inputs (``input_ids``, ``attention_mask``) and its vision inputs (every other tensor, in the
    order ``get_image_features`` takes them, ``pixel_values`` first; an audio model's ``get_audio_features``,
    ``input_features`` first: :func:`modality_of`)."""
    args, kwargs = normalise_sample(sample)
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        kwargs, args = dict(args[0]), ()
    modality = modality_of(kwargs)  # one modality: is_vision_language refused a sample of two
    main = modality.main_input(kwargs)
    if args or not isinstance(kwargs.get("input_ids"), torch.Tensor) or main not in kwargs:
        raise InputError(
            f"the generation sample of a vision-language model ({type(model).__name__}) is a dict of its processor's "
            f"tensors with input_ids and {main}",
            fix=f'pass pipeline.convert(model, {{"input_ids": ..., "attention_mask": ..., "{main}": '
            "...}, generation={...})",
        )
    check_features_alone(model, modality)
    fixed = fixed_inputs(model, kwargs)
    kwargs = {name: value for name, value in kwargs.items() if name not in fixed}
    check_tensors(model, kwargs)
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
    taken = image_input_names(model, modality)
    for name, value in kwargs.items():  # per-token inputs of the model's own (M-RoPE's mm_token_type_ids)
        if name not in (*TEXT_INPUTS, *taken) and value.shape == ids.shape and not value.is_floating_point():
            text[name] = value
    others = [name for name in kwargs if name not in (*TEXT_INPUTS, *text)]
    refused = sorted(name for name in others if name not in taken)
    if refused:
        raise InputError(
            f"the generation sample holds {', '.join(refused)}, which {type(model).__name__}.{modality.method} does "
            "not take",
            fix=f"pass input_ids, attention_mask and the {modality.name} inputs ({', '.join(taken)})",
        )
    vision = {name: kwargs[name] for name in sorted(others, key=taken.index)}
    items = image_rows(vision, item=modality.name)  # one item per leading row, or flattened patches a grid divides
    check_own_prompt(model, image_features_method(model, modality), modality.name, text, items)
    return text, vision


def check_tensors(model: Any, sample: dict[str, Any]) -> None:
    """An InputError naming the values of ``sample`` (but its fixed inputs) that are not tensors, and why each is
    refused: a scalar the model's forward does not take, or not a scalar at all."""
    refused = {name: value for name, value in sample.items() if not isinstance(value, torch.Tensor)}
    if not refused:
        return
    why = [
        f"{name} ({type(value).__name__}: "
        + (
            f"{type(model).__name__}.forward takes no {name}"
            if isinstance(value, FIXED_KINDS)
            else "neither a tensor nor a scalar option of the model's forward"
        )
        + ")"
        for name, value in sorted(refused.items())
    ]
    raise InputError(
        f"the generation sample's {', '.join(why)} are not tensors",
        fix="pass tensors (the processor's return_tensors='pt' output), and as options only scalars (a bool, int, "
        "float, string or None) named as the model's forward takes them (sample=False), which every call takes",
    )
