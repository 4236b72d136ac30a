"""The sample search of the every-class diffusers source (:mod:`model_sources.diffusers_all_models`): the inputs a
model's ``forward`` names, filled from its built config in the layouts diffusers' models take (image, video, packed
tokens, audio latents; text states, pooled projections, timesteps, rotary ids, masks), likeliest first
(:func:`candidate_samples`)."""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from model_sources import seeded

#: The small sizes: a width of ``HEADS * HEAD_DIM`` (every text, pooled and conditioning width too, so that one
#: text state fits whichever of them a model reads), one layer per stage.
HEADS, HEAD_DIM, WIDTH, FFN, LAYERS, GROUPS, VOCABULARY, SIDE = 2, 16, 32, 64, 1, 8, 64, 16

#: Forward inputs by kind. The first parameter of ``forward`` is the latents too, whatever its name.
LATENTS = ("sample", "hidden_states", "x", "latents", "z", "mel", "inputs_embeds", "controls_latents", "image_latents")
TIMESTEPS = (
    "timestep", "timesteps", "t", "timestep_r", "r_timestep", "timestep_ratio", "decoder_noise_time", "sigma",
    "audio_timestep", "bb_ca_time", "local_latents_time",
)  # fmt: skip
TEXT = (
    "encoder_hidden_states", "encoder_hidden_states_t5", "encoder_hidden_states_1", "encoder_hidden_states_2",
    "text_hidden_states", "cap_feats", "text_bth", "source_hidden_states", "prompt_embeds",
    "audio_encoder_hidden_states", "lyric_hidden_states", "hidden_states_1", "prefix_embeds",
)  # fmt: skip
MASKS = (
    "encoder_attention_mask", "text_embedding_mask", "text_embedding_mask_t5", "encoder_hidden_states_mask",
    "encoder_mask", "text_attention_mask", "lyric_attention_mask", "audio_encoder_attention_mask",
    "encoder_attention_mask_2", "attention_mask_1", "mask",
)  # fmt: skip
POOLED = (
    "pooled_projections", "pooled_embeds", "global_hidden_states", "clip_text_pooled", "pooled_text_emb",
    "proj_embedding", "image_embeddings",
)  # fmt: skip
#: Config names read for each size, first found wins.
CHANNEL_KEYS = (
    "in_channels", "encoder_in_channels", "in_visual_dim", "in_dim", "io_channels", "audio_channels", "num_channels",
    "input_channels", "dec_out_channels", "embedding_dim",
    "latent_channels", "num_mels", "mel_bins", "z_dim", "latent_dim", "out_channels",
)  # fmt: skip
TEXT_KEYS = (
    "caption_channels", "text_embed_dim", "text_dim", "joint_attention_dim", "context_in_dim", "cap_feat_dim",
    "text_in_dim", "in_text_dim", "cond_token_dim", "text_hidden_dim", "dit_text_dim", "encoder_hid_dim",
    "cross_attention_input_dim", "cross_attention_dim", "encoder_hidden_size", "condition_dim", "prefix_inner_dim",
    "text_encoder_dim",
)  # fmt: skip
POOLED_KEYS = (
    "pooled_projection_dim", "global_states_input_dim", "clip_text_pooled_in_channels", "in_text_dim2", "embedding_dim",
)  # fmt: skip
TOKENS_TEXT = 8
TEXT_LENGTHS = ("max_text_seq_length", "text_len", "max_sequence_length", "num_text_tokens")
#: The optional inputs given: the conditioning every model that takes them reads.
OPTIONAL = (
    "timestep", "timesteps", "t", "encoder_hidden_states", "pooled_projections", "img_ids", "txt_ids", "img_shapes",
    "guidance", "class_labels", "controlnet_cond", "conditioning_scale", "added_time_ids", "image_embeddings",
    "global_hidden_states", "pooled_embeds", "num_frames", "height", "width", "control_hidden_states", "padding_mask",
    "text_hidden_states", "start_seconds", "end_seconds", *MASKS,
)  # fmt: skip
#: The inputs a Multi-ControlNet takes one of per ControlNet.
PER_NET = ("controlnet_cond", "conditioning_scale", "controlnet_mode")


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded(seed))


def _config(model: torch.nn.Module, *names: str, default: Any = None) -> Any:
    """The first of ``names`` the model's config sets (a Multi-ControlNet's: its first ControlNet's)."""
    nets = getattr(model, "nets", None)
    config = getattr(nets[0] if isinstance(nets, torch.nn.ModuleList) and len(nets) else model, "config", {})
    for name in names:
        value = config.get(name) if hasattr(config, "get") else None
        if value is not None:
            return value
    return default


def _first_int(value: Any, default: int) -> int:
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else default
    return int(value) if type(value) is int else default


def layouts(model: torch.nn.Module, parameters: list[str]) -> list[str]:
    """The latents' layouts to try, the likeliest first: packed tokens for a model that takes rotary ids or a grid,
    video for a 3-D model, a sequence for a 1-D or audio one, else an image."""
    name = type(model).__name__ + type(model).__module__
    order = ["image", "video", "tokens", "frames", "sequence", "sequence-last", "waveform", "vector", "list"]
    if {"img_ids", "img_shapes", "num_frames", "video_coords", "height"} & set(parameters):
        first = "tokens"
    elif re.search(r"3D|Video|Motion|Temporal|video|I2V", name):
        first = "video"
    elif re.search(r"1D|Audio|audio|Music|Oobleck|Vocoder|SAME", name):
        first = "sequence"
    else:
        first = "image"
    return [first, *[layout for layout in order if layout != first]]


def _latents(layout: str, channels: int, side: int, frames: int, grid: int) -> Any:
    if layout == "image":
        return _randn(1, channels, side, side)
    if layout == "video":
        return _randn(1, channels, frames, side, side)
    if layout == "frames":
        return _randn(1, frames, channels, side, side)
    if layout == "tokens":
        return _randn(1, grid * grid, channels)
    if layout == "sequence":
        return _randn(1, channels, side * side)
    if layout == "sequence-last":
        return _randn(1, side * side, channels)
    if layout == "waveform":
        return _randn(1, 16 * side * side)
    if layout == "vector":
        return _randn(1, channels)
    return [_randn(channels, 1, side, side)]


def _ids(count_h: int, count_w: int, axes: int) -> torch.Tensor:
    """Flux-style position ids ``(h * w, axes)``: zeros but the last two axes, row and column."""
    ids = torch.zeros(count_h, count_w, axes)
    ids[..., -2] = torch.arange(count_h)[:, None]
    ids[..., -1] = torch.arange(count_w)[None, :]
    return ids.reshape(-1, axes)


def _input(name: str, model: torch.nn.Module, shape: dict[str, Any]) -> Any:
    """The value of one named forward input in the candidate ``shape``, or ``inspect.Parameter.empty``."""
    text = _first_int(_config(model, *TEXT_KEYS), WIDTH)
    pooled = _first_int(_config(model, *POOLED_KEYS), text)
    grid, axes = (
        shape["grid"],
        len(_config(model, "axes_dims_rope", "axes_dim_rope", "rope_axes_dim", default=(0,) * 3)),
    )
    if name in LATENTS or name == shape["main"]:
        return shape["latents"]
    if name in TIMESTEPS:
        return shape["timestep"]
    if name in TEXT:
        length = shape["text"]
        return [_randn(length, text, seed=1)] if shape["layout"] == "list" else _randn(1, length, text, seed=1)
    if name in MASKS:
        return torch.ones(1, shape["text"], dtype=shape["mask"])
    if name in POOLED:
        return _randn(1, pooled, seed=2)
    values: dict[str, Callable[[], Any]] = {
        "img_ids": lambda: _ids(grid, grid, max(axes, 2)),
        "txt_ids": lambda: torch.zeros(shape["text"], max(axes, 2)),
        "img_shapes": lambda: [[(1, grid, grid)]],
        "guidance": lambda: torch.tensor([3.5]),
        "class_labels": lambda: torch.tensor([1]),
        "conditioning_scale": lambda: 1.0,
        "num_frames": lambda: 1 if shape["layout"] == "tokens" else shape["frames"],
        "height": lambda: grid if shape["layout"] == "tokens" else shape["side"],
        "width": lambda: grid if shape["layout"] == "tokens" else shape["side"],
        "fps": lambda: torch.tensor([8]),
        "added_time_ids": lambda: _randn(1, _time_ids(model), seed=3),
        "original_size": lambda: torch.tensor([[8.0 * shape["side"]] * 2]),
        "target_size": lambda: torch.tensor([[8.0 * shape["side"]] * 2]),
        "crop_coords": lambda: torch.zeros(1, 2),
        "micro_conds": lambda: _randn(1, 5, seed=3),
        "controlnet_cond": lambda: _condition(model, shape),
        "start_seconds": lambda: torch.tensor([1.0]),  # Stable Audio's projection: seconds into the clip
        "end_seconds": lambda: torch.tensor([5.0]),
    }
    value = values[name]() if name in values else _derived(name, model, shape)
    nets = getattr(model, "nets", None)
    if name in PER_NET and isinstance(nets, torch.nn.ModuleList):  # a Multi-ControlNet zips them with its nets
        return [None if value is inspect.Parameter.empty else value] * len(nets)
    return value


def _derived(name: str, model: torch.nn.Module, shape: dict[str, Any]) -> Any:
    """An input known by the form of its name: more latents (``audio_hidden_states``, ``context_latents``: like the
    latents, with the channels of the config's ``<prefix>_in_channels`` when it has one), token ids below the
    vocabulary, lengths of the text, a mask over the latents."""
    latents = shape["latents"]
    if re.search(r"(latents|_hidden_states)$", name) and isinstance(latents, torch.Tensor):
        named = [f"{name.split('_')[0]}_in_channels"] + [k for k in _config_keys(model) if k.endswith("_in_channels")]
        channels = _first_int(_config(model, *named), 0)
        if channels and shape["layout"] in ("tokens", "sequence-last"):
            return _randn(*latents.shape[:-1], channels, seed=5)
        if channels and shape["layout"] in ("image", "video", "sequence"):
            return _randn(latents.shape[0], channels, *latents.shape[2:], seed=5)
        return torch.randn(latents.shape, generator=seeded(5))
    if name.endswith("input_ids"):
        return torch.randint(0, _first_int(_config(model, "vocab_size", "target_vocab_size"), 64), (1, shape["text"]))
    if name.endswith("_lens"):
        return torch.tensor([shape["text"]])
    if name in ("condition_mask", "padding_mask") and isinstance(latents, torch.Tensor) and latents.dim() >= 4:
        return (
            torch.ones(1, 1, *latents.shape[2:]) if name == "condition_mask" else torch.zeros(1, 1, *latents.shape[-2:])
        )
    if name == "scale":
        return _first_int(list(_config(model, "scales", default=(2,)))[:1], 2)
    return inspect.Parameter.empty


def _config_keys(model: torch.nn.Module) -> list[str]:
    config = getattr(model, "config", {})
    return sorted(config.keys()) if hasattr(config, "keys") else []


def _time_ids(model: torch.nn.Module) -> int:
    """How many numbers ``added_time_ids`` holds: the class embedding's input over each number's embedding."""
    total, each = _config(model, "projection_class_embeddings_input_dim"), _config(model, "addition_time_embed_dim")
    return max(1, total // each) if type(total) is int and type(each) is int and each else 3


def _condition(model: torch.nn.Module, shape: dict[str, Any]) -> Any:
    """A ControlNet's condition: an image at the latents' size times the condition embedding's downsampling (a UNet
    ControlNet's), else latents shaped like the model's own (a transformer ControlNet's)."""
    stages = _config(model, "conditioning_embedding_out_channels", "ctrl_conditioning_embedding_out_channels")
    if isinstance(stages, (list, tuple)) and shape["layout"] in ("image", "video"):
        channels = _first_int(_config(model, "conditioning_channels", "ctrl_conditioning_channels"), 3)
        side = shape["side"] * 2 ** (len(stages) - 1)
        if shape["layout"] == "video":
            return _randn(1, channels, shape["frames"], side, side, seed=4)
        return _randn(1, channels, side, side, seed=4)
    return shape["latents"]


def _shapes(model: torch.nn.Module, parameters: list[str]) -> list[dict[str, Any]]:
    """The candidate shapes, each layout in its likeliest form first, then the other forms (channel count from the
    config, side, frame count, integer timesteps) one choice away from it, then the rest."""
    channels = [c for c in dict.fromkeys(_first_int(_config(model, key), 0) for key in CHANNEL_KEYS) if c > 0][:3]
    configured = _first_int(_config(model, "sample_size"), 0)
    sides = list(dict.fromkeys([s for s in (configured,) if 0 < s <= 64] + [SIDE, 32, 8]))
    # a text as long as the config's (CogVideoX adds positions for exactly that many tokens), after a short one
    texts = [TOKENS_TEXT] + [n for n in (_first_int(_config(model, *TEXT_LENGTHS), 0),) if TOKENS_TEXT < n <= 512]
    ranked = []
    for order, layout in enumerate(layouts(model, parameters)):
        video = layout in ("video", "frames")
        choices = itertools.product(
            enumerate(channels or [4]),
            enumerate(sides[:2] if video else sides),
            enumerate((5, 2, 9) if video else (1,)),
            enumerate((torch.tensor([0.5]), torch.tensor([10]))),
            enumerate((torch.bool, torch.long)),
            enumerate(texts),
            enumerate((False, True)),
        )
        for chosen in choices:
            (_, count), (_, side), (_, frames), (_, timestep), (_, mask), (_, text), (_, masked) = chosen
            rank = sum(index > 0 for index, _ in chosen)
            grid = max(1, side // 4)
            shape = {
                "layout": layout, "side": side, "frames": frames, "grid": grid, "timestep": timestep, "mask": mask,
                "channels": count, "text": text, "masked": masked, "main": parameters[0] if parameters else "",
            }  # fmt: skip
            ranked.append((rank, order, shape))
    return [shape for _, _, shape in sorted(ranked, key=lambda item: (item[0], item[1]))]


#: Candidate samples tried per model at most (the likeliest first), so a model that runs on none fails in seconds.
MAX_CANDIDATES = 40


def candidate_samples(model: torch.nn.Module) -> Iterator[dict[str, Any]]:
    """The samples to try, in order (at most :data:`MAX_CANDIDATES`, no two alike): the inputs ``forward`` requires
    and the optional ones of :data:`OPTIONAL` it takes, filled from the model's config in each candidate shape of
    :func:`_shapes`. Raises when a required input is of no known kind in every shape (no sample can be made)."""
    signature = inspect.signature(model.forward).parameters
    parameters = [n for n, p in signature.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [n for n in parameters if signature[n].default is inspect.Parameter.empty]
    # an optional input is given only when it is of a kind every model of the kind reads (a second timestep, more
    # latents, an image condition are read by some configurations only, and refused by the others)
    optional = [n for n in parameters if n not in required and n in OPTIONAL]
    # inputs a model takes only when its config says so: guidance's embedding, a class embedding
    if not _config(model, "guidance_embeds"):
        optional = [n for n in optional if n != "guidance"]
    if not _config(model, "num_class_embeds", "class_embed_type", "num_embeds_ada_norm"):
        optional = [n for n in optional if n != "class_labels"]
    seen, missing = set(), []
    for shape in _shapes(model, parameters):
        shape["latents"] = _latents(shape["layout"], shape["channels"], shape["side"], shape["frames"], shape["grid"])
        sample = {name: _input(name, model, shape) for name in required}
        if any(value is inspect.Parameter.empty for value in sample.values()):
            missing = missing or [name for name, value in sample.items() if value is inspect.Parameter.empty]
            continue
        extra = {name: _input(name, model, shape) for name in optional if shape["masked"] or name not in MASKS}
        sample |= {name: value for name, value in extra.items() if value is not inspect.Parameter.empty}
        key = _signature(sample)
        if key not in seen:  # a choice of a kind of input the model does not take gives the same sample again
            seen.add(key)
            yield sample
        if len(seen) >= MAX_CANDIDATES:
            return
    if not seen:
        raise ValueError(f"forward requires inputs of no known kind: {missing}")


def _signature(value: Any) -> str:
    """Shapes, types and small values of a sample, to tell two candidates apart."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{list(value.shape)}{value.flatten()[:1].tolist()}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_signature(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_signature(v) for v in value) + "]"
    return repr(value)


def one_line(exc: BaseException, limit: int) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"
