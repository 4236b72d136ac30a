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
import re
from typing import Any

import torch
import torch.utils._pytree as pytree  # diffusers registers its output classes

from model_sources import ModelCase
from model_sources.diffusers_samples import (
    FFN,
    GROUPS,
    HEAD_DIM,
    HEADS,
    LAYERS,
    SIDE,
    VOCABULARY,
    WIDTH,
    candidate_samples,
    one_line,
)

SOURCE = "diffusers_all"


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


def _build(class_name: str, variant: int) -> tuple[torch.nn.Module, Any]:
    cls = getattr(_diffusers(), class_name)
    torch.manual_seed(0)
    model = cls(**shrunk_arguments(cls, variant)).eval()
    first = None
    for sample in candidate_samples(model):
        try:
            with torch.no_grad():
                result = model(**sample)
        except Exception as exc:  # noqa: BLE001 - the next candidate; the first one's error is reported
            first = first or one_line(exc, 200)
            continue
        if not any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(result)):
            raise RuntimeError("forward returns no tensor (a container of other models, or a stub to load weights)")
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
            errors.append(f"[{name}] {one_line(exc, 300)}")
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
