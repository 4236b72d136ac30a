"""diffusers, every model class: each ``ModelMixin`` subclass diffusers exports, from one generic shrinker.

Nothing here lists architectures. The classes are what ``dir(diffusers)`` names (:func:`model_classes`); each is built
from its constructor's own arguments (``register_to_config``), shrunk by name (:func:`shrunk_arguments`: widths of 32
as 2 heads of 16, one layer per stage, channel tuples of 32 at their length, 8 norm groups, rotary axes scaled to
the head size, small vocabularies, strides of 2), the variants of :data:`VARIANTS` tried in turn, plus
:data:`OVERRIDES` where a class needs one, each with its reason. Input, output and latent channel counts keep their
defaults: they tie a model to its VAE's latents and to its patch packing, and cost little. The sample is found, not
declared: :func:`candidate_samples` fills the inputs ``forward`` names (the latents in the layouts diffusers' models
take: image, video, packed tokens, audio; the text states, pooled projections, timesteps, rotary ids, masks) from the
built model's config, and the first candidate the model runs eagerly is the sample. A class that builds or runs on
none is PyTorch's outcome in the table (``pytorch``, not counted), with each variant's first error.

A wrapper of several models (``MultiControlNetModel``, ``FluxMultiControlNetModel``, ``MultiAdapter``) is built from
small instances of the class its constructor's annotation or its name (without ``Multi``) names, one per layer of the
variant, and takes its per-model inputs as lists.

Families (:func:`family_of`) are read from the class name and module: ``controlnet``, ``audio``, ``autoencoder``,
``video`` (3-D transformers and UNets), ``unet``, ``transformer`` (2-D, DiT-style) and ``other``.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from model_sources import ModelCase, seeded

SOURCE = "diffusers_all"

#: The small sizes: a width of ``HEADS * HEAD_DIM`` (every text, pooled and conditioning width too, so that one
#: text state fits whichever of them a model reads), one layer per stage.
HEADS, HEAD_DIM, WIDTH, FFN, LAYERS, GROUPS, VOCABULARY, SIDE = 2, 16, 32, 64, 1, 8, 64, 16

#: (name, sizes that differ from the small ones): the shrinks tried in turn, the first whose model builds and runs
#: wins. Constraints a constructor checks (a model that needs two layers for its skips, heads of 32 for its rotary
#: split, the default channel tuples for blocks that double their width) are met by one of them without a class name.
VARIANTS: tuple[tuple[str, dict[str, int]], ...] = (
    ("small", {}),
    # a model whose patch size and input channels default to None (Transformer2DModel's patched mode, HunyuanDiT)
    ("patches of 2", {"PATCH": 2}),
    # two layers (a model with long skips), two sub-models (MultiAdapter refuses one)
    ("two layers", {"LAYERS": 2}),
    ("heads of 32", {"HEAD_DIM": 32, "WIDTH": 64, "FFN": 128}),
    ("4 heads of 16", {"HEADS": 4, "WIDTH": 64, "FFN": 128, "GROUPS": 16}),
    # a head size a model fixes in its code (Kandinsky 6's 128)
    ("heads of 128", {"HEAD_DIM": 128, "WIDTH": 256, "FFN": 256}),
)

#: class name -> constructor arguments beyond the shrinker's, each with its reason.
OVERRIDES: dict[str, dict[str, Any]] = {
    # the projection of AudioLDM 2's two text encoders and language model: their widths have no default
    "AudioLDM2ProjectionModel": {"text_encoder_dim": WIDTH, "text_encoder_1_dim": WIDTH, "langauge_model_dim": WIDTH},
    # Stable Audio's conditioning projection: widths and the seconds' range have no default
    "StableAudioProjectionModel": {
        "text_encoder_dim": WIDTH, "conditioning_dim": WIDTH, "min_value": 0, "max_value": 8,
    },
    # UniDiffuser's caption decoder (a GPT-2 over a prefix): the prefix has no default size
    "UniDiffuserTextDecoder": {"prefix_length": 4, "prefix_inner_dim": WIDTH},
    # Oobleck's latent is half its encoder's last width (mean and scale): the decoder's input follows the shrunk width
    "AutoencoderOobleck": {"decoder_input_channels": WIDTH // 2},
    # HunyuanImage's VAE: no argument has a default (HunyuanImage 2.1's are 32 latent channels, 32x compression)
    "AutoencoderKLHunyuanImage": {
        "in_channels": 3, "out_channels": 3, "latent_channels": 8, "block_out_channels": (32, 32, 32, 32, 32, 32),
        "layers_per_block": 1, "spatial_compression_ratio": 32, "sample_size": 64,
    },
}  # fmt: skip

#: Parameters that keep their default: input, output and latent channel counts (they tie a model to its VAE's latents
#: and to its patch packing), and sizes of positions, windows, kernels, strides of the patches.
_KEEP = re.compile(
    r"^(in|out|input|output|io)_|_(in|out)(_channels|_dim|_ch|_features)?$|latent|^z_|^num_channels$|mel|"
    r"conditioning_channels$|audio_channels$|in_dim$|out_dim$|input_(channels|dim)$|kernel|window|batch|max|^patch|_patch|sample_rate|"
    r"sampling_rate|hop|fft|seq|len|length|resolution|input_size|target_size|theta|scale|ratio$|_eps$"
)
_HEADS = re.compile(r"heads$|^nheads$|^heads$|^n_head$")
_HEAD_DIM = re.compile(r"head_dim$|^dim_head|_dim_head$|^d_kv$|^head_dim")
_FFN = re.compile(
    r"intermediate_size$|intermediate_dim$|ffn_dim$|^ff_dim|^d_ff$|ffn_hidden_size$|ff_inner_dim$|mlp_dim$"
)
_LAYERS = re.compile(
    r"(^|_)(num_|n_)?(\w+_)?layers(_per_block|_per_mid_block)?$|^nlayers$|depth$|num_res_blocks$|(^|_)num_\w*blocks$|"
    r"^n_\w*blocks$|_num_blocks$|^num_blocks$|layers_per_\w+$|^n_layer$"
)
_LAYER_INDICES = re.compile(r"(layers|layer_ids|_places|_blocks_ids)$")
_ROTARY = re.compile(r"axes_dims?(_rope)?$|rope_axes_dims?$|^rope_dim(_list)?$|^rotary_dim$|mrope_section$")
_GROUPS = re.compile(r"num_groups$|^groups$|^resnet_groups$")
_VOCABULARY = re.compile(r"vocab_size$|codebook_size$|num_vq_embeddings$|^num_vector_embeds$")
_STRIDES = re.compile(r"(rates|strides|downsampling_ratios|upsampling_ratios)$")
_SPATIAL = re.compile(r"^sample_size$|^sample_(height|width)$|^image_size$")
_WIDTH = re.compile(r"(dim|_size|channels?|_ch|^ch|^n_embd)(_t5|\d)?$")


def _diffusers() -> Any:
    import tests_environment  # noqa: F401 -- torchvision's operator schemas: diffusers' loaders import transformers

    return importlib.import_module("diffusers")  # after them, whatever the sorting of imports says


def model_classes() -> list[str]:
    """Every ``ModelMixin`` subclass ``diffusers`` exports at top level (``ModelMixin`` itself left out), sorted."""
    diffusers = _diffusers()
    found = []
    for name in dir(diffusers):
        try:
            value = getattr(diffusers, name)
        except Exception:  # noqa: BLE001, S112 - a lazy name whose module does not import here is no model class
            continue
        if inspect.isclass(value) and issubclass(value, diffusers.ModelMixin) and value is not diffusers.ModelMixin:
            found.append(name)
    return sorted(found)


def _sizes(variant: int) -> dict[str, int]:
    base = {"HEADS": HEADS, "HEAD_DIM": HEAD_DIM, "WIDTH": WIDTH, "FFN": FFN, "LAYERS": LAYERS}
    return base | {"GROUPS": GROUPS, "VOCABULARY": VOCABULARY, "SIDE": SIDE, "PATCH": 0} | VARIANTS[variant][1]


def _ints(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(type(v) is int for v in value)


def _like(value: Any, items: list[Any]) -> Any:
    """``items`` in the container type of ``value`` (a tuple stays a tuple)."""
    return tuple(items) if isinstance(value, tuple) else list(items)


def _each(value: Any, small: int) -> Any:
    """``small`` in place of an int, or of each int of a (nested) tuple, keeping its length; 0 stays 0."""
    if type(value) is int:
        return min(value, small) if value > 0 else value
    if (
        isinstance(value, (list, tuple))
        and value
        and all(type(v) is int or isinstance(v, (list, tuple)) for v in value)
    ):
        return _like(value, [_each(v, small) for v in value])
    return value


def _scaled_axes(value: Any, factor: float, even: bool) -> Any:
    """Rotary axis sizes scaled by ``factor`` (the head size's), each even where ``even``, their sum kept exact."""
    step = 2 if even else 1
    total = round(sum(value) * factor / step) * step
    scaled = [max(step, round(v * factor / step) * step) for v in value]
    scaled[scaled.index(max(scaled))] += total - sum(scaled)
    return _like(value, scaled)


def _head_size(defaults: dict[str, Any]) -> int | None:
    """The default head size: a head-size argument, else a width over the heads."""
    for name, value in defaults.items():
        if _HEAD_DIM.search(name) and type(value) is int and not name.startswith(("cross_", "audio_", "decoder_")):
            return value
    heads = next((v for n, v in defaults.items() if _HEADS.search(n) and "kv" not in n and type(v) is int), None)
    width = next((v for n, v in defaults.items() if n in ("hidden_size", "dim", "model_dim", "d_model")), None)
    return width // heads if type(width) is int and type(heads) is int and heads else None


def shrunk_value(name: str, value: Any, sizes: dict[str, int], head_factor: float) -> Any:
    """A constructor argument's small value, by its name and default (the default when no rule names it)."""
    if value is None:  # a size left unset that the model needs (DreamLite's in_channels) or takes (a patch size)
        unset = {"in_channels": 16, "sample_size": sizes["SIDE"], "patch_size": sizes["PATCH"] or None}
        if _ROTARY.search(name):  # rotary axes a model derives from a default head size: half the head each
            return [sizes["HEAD_DIM"] // 2] * 2
        if _HEADS.search(name) and "kv" in name:  # key-value heads as many as the heads (LuminaNext's)
            return sizes["HEADS"]
        return unset.get(name)
    if isinstance(value, (bool, float, str)):
        return value
    if _ROTARY.search(name) and _ints(value):
        return _scaled_axes(value, head_factor, even="section" not in name)
    if name == "rotary_dim" and type(value) is int:
        return max(2, round(value * head_factor / 2) * 2)
    if _LAYER_INDICES.search(name) and _ints(value) and (0 in value or list(value) == sorted(set(value))):
        return _like(value, [i for i in value if i < sizes["LAYERS"]] or [0])  # indices of layers, not counts
    if _LAYERS.search(name) and not name.startswith("max_"):
        return _each(value, sizes["LAYERS"])
    if name.endswith("channels") and _ints(value):  # the stages' widths (block_out_channels), at their count
        return _each(value, sizes["WIDTH"])
    if _KEEP.search(name):
        return value
    if _HEADS.search(name):
        return _each(value, sizes["HEADS"])
    if _HEAD_DIM.search(name):
        return _each(value, sizes["HEAD_DIM"])
    if _FFN.search(name):
        return _each(value, sizes["FFN"])
    if _GROUPS.search(name):
        return _each(value, sizes["GROUPS"])
    if _VOCABULARY.search(name):
        return _each(value, sizes["VOCABULARY"])
    if name.endswith("_token_id") and type(value) is int:  # inside the small vocabulary
        return min(value, sizes["VOCABULARY"] - 1)
    if _STRIDES.search(name) and _ints(value):
        return _like(value, [min(v, 2) for v in value])
    if _SPATIAL.search(name):
        return _each(value, sizes["SIDE"])
    if _WIDTH.search(name) and (type(value) is int or _ints(value)):
        return _each(value, sizes["WIDTH"])
    return value


def constructor_defaults(cls: type) -> dict[str, Any]:
    """The constructor's arguments with their defaults (``inspect.Parameter.empty`` for required ones)."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return {p.name: p.default for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def shrunk_arguments(cls: type, variant: int = 0) -> dict[str, Any]:
    """The class's small constructor arguments (:data:`VARIANTS`' ``variant``) with its :data:`OVERRIDES`; a required
    argument that names sub-models (a Multi-ControlNet's ``controlnets``) gets as many as layers, built small."""
    sizes = _sizes(variant)
    defaults = constructor_defaults(cls)
    known = {n: v for n, v in defaults.items() if v is not inspect.Parameter.empty}
    head = _head_size(known)
    factor = sizes["HEAD_DIM"] / head if head else 1.0
    arguments = {name: shrunk_value(name, value, sizes, factor) for name, value in known.items()}
    arguments |= OVERRIDES.get(cls.__name__, {})
    for name in defaults.keys() - arguments.keys():
        sub = _sub_model_class(cls, name)
        if sub is not None:
            arguments[name] = [sub(**shrunk_arguments(sub, variant)) for _ in range(sizes["LAYERS"])]
    return arguments


def _sub_model_class(cls: type, parameter: str) -> type | None:
    """The model class a wrapper's argument holds: named in its annotation, else the wrapper's name without
    ``Multi`` (``FluxMultiControlNetModel`` holds ``FluxControlNetModel``)."""
    diffusers = _diffusers()
    annotation = str(inspect.signature(cls.__init__).parameters[parameter].annotation)
    for name in [*re.findall(r"\w+", annotation)[::-1], cls.__name__.replace("Multi", "")]:
        found = getattr(diffusers, name, None) if name in dir(diffusers) else None
        if inspect.isclass(found) and issubclass(found, diffusers.ModelMixin) and found is not cls:
            return found
    return None


# --- samples ---------------------------------------------------------------------------------------------------

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
    *MASKS,
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


def _one_line(exc: BaseException, limit: int) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


def _build(class_name: str, variant: int) -> tuple[torch.nn.Module, Any]:
    cls = getattr(_diffusers(), class_name)
    torch.manual_seed(0)
    model = cls(**shrunk_arguments(cls, variant)).eval()
    first = None
    for sample in candidate_samples(model):
        try:
            with torch.no_grad():
                model(**sample)
        except Exception as exc:  # noqa: BLE001 - the next candidate; the first one's error is reported
            first = first or _one_line(exc, 200)
            continue
        return model, ((), sample)
    raise RuntimeError(f"no candidate sample runs: {first}")


def build(class_name: str) -> tuple[torch.nn.Module, Any]:
    """The model (random weights, eval mode) of the first :data:`VARIANTS` shrink it builds and runs with, on the first
    candidate sample it runs on; raises with every variant's first error when none runs."""
    errors = []
    for variant, (name, _) in enumerate(VARIANTS):
        try:
            return _build(class_name, variant)
        except Exception as exc:  # noqa: BLE001 - the next shrink; all are reported when none runs
            errors.append(f"[{name}] {_one_line(exc, 300)}")
    raise RuntimeError(f"{class_name} does not run eagerly from a small config: " + " || ".join(errors))


def family_of(class_name: str) -> str:
    """The class's family, read from its name and module path."""
    cls = getattr(_diffusers(), class_name)
    text = f"{class_name} {cls.__module__}"
    if re.search(r"ControlNet|controlnet|models\.adapter", text):  # T2I adapters too; not AnimateDiff's motion one
        return "controlnet"
    if re.search(r"Audio|audio|Music|music|Vocoder|vocoder|oobleck|Oobleck", text):
        return "audio"
    if re.search(r"Autoencoder|autoencoder|VAE|Vae|VQModel|vq_model", text):
        return "autoencoder"
    if re.search(r"3D|Video|video|Motion|SpatioTemporal|I2V", text):
        return "video"
    if re.search(r"UNet|unet", text):
        return "unet"
    if re.search(r"Transformer|transformer|DiT", text):
        return "transformer"
    return "other"


def cases() -> list[ModelCase]:
    """One case per exported model class, in name order."""
    return [
        ModelCase(SOURCE, name, family_of(name), lambda n=name: build(n))  # type: ignore[misc]
        for name in model_classes()
    ]
