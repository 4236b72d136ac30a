"""The shrinker of the every-type source (:mod:`model_sources.transformers_all_models`): a model type's small config
(:func:`shrunk`) from ``SMALL``'s sizes, the :data:`VARIANTS` tried in turn and the :data:`OVERRIDES` a type needs,
its ``AutoConfig`` sub-configs shrunk as their own types, with the repairs its own validation's messages ask for
(:func:`tied_size` and the others here, :mod:`model_sources.config_repairs`) and its derived sizes fitted
(:mod:`model_sources.transformers_all_fitting`)."""

from __future__ import annotations

import inspect
import re
from typing import Any

from model_sources import config_repairs
from model_sources.transformers_all_config import (
    SPECIAL_TOKENS,
    configs,
    first_attribute,
    modeling_auto,
    placeholder_names,
)
from model_sources.transformers_all_fitting import fit_image_tokens, fit_sizes
from model_sources.transformers_models import ARCHITECTURES, SMALL, _fitting

#: model_type -> config overrides beyond ``SMALL``, each with its reason. The curated suite's overrides
#: (``transformers_models.ARCHITECTURES``) apply too.
OVERRIDES: dict[str, dict[str, Any]] = {
    # FSMT names its vocabularies per side (42024 each by default)
    "fsmt": {"src_vocab_size": 128, "tgt_vocab_size": 128},
    # ProphetNet names its encoder's layers and both sides' heads its own way (12 layers, 16 heads of 2 dims)
    "prophetnet": {"num_encoder_layers": 2, "num_encoder_attention_heads": 2, "num_decoder_attention_heads": 2},
    "xlm-prophetnet": {"num_encoder_layers": 2, "num_encoder_attention_heads": 2, "num_decoder_attention_heads": 2},
    # LED's window of 512 would pad the 8-token sample to 512
    "led": {"attention_window": 4},
    # PEGASUS-X's blocks of 512 and 32 global tokens, to the sample's scale
    "pegasus_x": {"block_size": 4, "num_global_tokens": 4},
    # Granite 4 Vision's projector needs what its config leaves to the checkpoint (None by default, no size to derive
    # them from): the window Q-Former's rate and which tower layer feeds which text layer
    "granite4_vision": {"downsample_rate": "1/2", "deepstack_layer_map": [[-1, 0]]},
    # Chameleon and Emu3 read their image tokens' ids from their tokenizer's vocabulary (``vocabulary_map``, None by
    # default: a checkpoint's config holds it), named as the tokenizer names them: the image placeholder, then one BPE
    # token per code of a VQ codebook shrunk to 16 codes (ids 100-115, above the drawn text); Emu3's end of a row of
    # codes is its ``<|extra_200|>``. Their VQ tokenizers' sizes (given to every sub-config, as ``SMALL``'s are) shrunk
    # to 16 codes of a 32x32 image (a factor of 8: 4x4 codes)
    "chameleon": {
        "base_channels": 32, "channel_multiplier": [1, 1, 1, 1], "num_res_blocks": 1, "embed_dim": 8,
        "latent_channels": 32, "num_embeddings": 16, "resolution": 32,
        "vocabulary_map": {"<image>": 127} | {
            "IMGIMG" + "".join(chr(ord("A") + int(digit)) for digit in str(code)) + "Z": 100 + code
            for code in range(16)
        },
    },
    "emu3": {
        "base_channels": 32, "channel_multiplier": [1, 1, 1, 1], "num_res_blocks": 1, "embed_dim": 4,
        "codebook_size": 16, "temporal_downsample_factor": 1, "attn_resolutions": [],
        "vocabulary_map": {"<image>": 127, "<|extra_200|>": 116} | {
            f"<|visual token {code:06d}|>": 100 + code for code in range(16)
        },
    },
    # PerceptionLM's and FastVLM's towers are timm models (``timm_wrapper``), named by the checkpoint (PerceptionLM's
    # default names none): the checkpoint's timm architecture, its sizes as timm takes them (``model_args``), shrunk
    "perception_lm": {
        "vision_config": {"model_type": "timm_wrapper", "architecture": "vit_pe_core_tiny_patch16_384",
                          "model_args": {"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": 32, "patch_size": 8,
                                         "ref_feat_shape": (4, 4), "attn_pool_num_heads": 2}},
    },
    # Kosmos-2.5's text model names its sizes its own way (24 layers of 16 heads, 6144 wide), its image is 2048 latent
    # queries, and its patch projection takes 16x16x3 patches: 8x8x3 patches of the 32x32 image, 16 queries
    "kosmos-2.5": {"layers": 2, "attention_heads": 2, "ffn_dim": 64, "latent_query_num": 16,
                   "patch_embed_hidden_size": 192},
    # DeepSeek-OCR-2's text config leaves each layer's MLP kind to the checkpoint (None by default, which builds no
    # model): a dense layer, then a mixture of experts, as its checkpoint's first layers are; its SAM tower's neck
    # (512, 896 channels) ends at its second encoder's width (896 in the checkpoint), shrunk to 32
    "deepseek_ocr2": {"mlp_layer_types": ["dense", "sparse"], "downsample_channels": [16, 32]},
    # Unlimited-OCR's SAM neck (512, 1024 channels) ends at its second encoder's width, as DeepSeek-OCR-2's
    "unlimited_ocr": {"downsample_channels": [16, 32]},
    # (FastVLM's ``hidden_size`` is its tower's output width: twice the last stage's, which its final conv doubles)
    "fast_vlm": {
        "vision_config": {"model_type": "timm_wrapper", "architecture": "fastvit_mci3", "do_pooling": True,
                          "global_pool": "avg", "hidden_size": 64,
                          "model_args": {"inference_mode": True, "layers": (1, 1, 1, 1, 1),
                                         "embed_dims": (8, 16, 32, 32, 32)}},
    },
}  # fmt: skip


#: Sizes of vision-language models' towers named their own way (Qwen2-VL's 32 blocks of 1280), beyond ``SMALL``.
TOWER: dict[str, Any] = {"depth": 2, "embed_dim": 32}


def _transformers() -> Any:
    modeling_auto()
    import transformers

    return transformers


def _overrides(model_type: str) -> dict[str, Any]:
    curated = ARCHITECTURES.get(model_type)
    return {**(curated[2] if curated else {}), **OVERRIDES.get(model_type, {})}


#: (name, sizes set, sizes of ``SMALL`` left at the config's default): the shrinks tried in turn, the first whose
#: model builds and runs wins (its name is in the case's reason). Constraints a config checks (heads dividing the
#: width, key-value heads pairing, token ranges inside the vocabulary) are met by one of them without naming a type.
VARIANTS: tuple[tuple[str, dict[str, Any], tuple[str, ...]], ...] = (
    ("small", {}, ()),
    ("kv heads = heads", {"num_key_value_heads": 2}, ()),
    ("the config's vocabulary", {}, ("vocab_size",)),
    (
        "wider",
        {"hidden_size": 64, "d_model": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "num_experts_per_tok": 1},
        ("head_dim", "vocab_size"),
    ),
    # windows and strides sized for the config's own image (Swin's 7x7 windows over 224 / 4 patches)
    ("the config's image size", {}, ("image_size", "patch_size")),
    # rotary sections a model's code defaults to (Qwen2-VL's M-RoPE: 16 + 24 + 24 = half of 128)
    (
        "heads of 128",
        {"hidden_size": 256, "d_model": 256, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 128,
         "intermediate_size": 256},
        ("vocab_size",),
    ),
)  # fmt: skip


def shrunk(model_type: str, variant: int = 0) -> Any:
    """The type's small config (:data:`VARIANTS`' ``variant``) with the type's overrides; every sub-config the config
    class leaves to ``AutoConfig`` (a vision-language model's text model) shrunk as its own type; an image or audio
    token id outside the small vocabulary moved to its last ids; M-RoPE sections scaled to the small head size. A size
    the config's own validation ties to another (:func:`tied_size`) is set to match it, up to four times."""
    _name, sizes, kept = VARIANTS[variant]
    values = {k: v for k, v in SMALL.items() if k not in kept} | sizes

    def make(kind: str, extra: dict[str, Any] | None = None) -> Any:
        cls = _transformers().CONFIG_MAPPING[kind]
        repairs: dict[str, Any] = {}
        asked: list[str] = []  # the validation's messages whose repairs the arguments take (config_repairs)
        # a vision-language model's tower (its vision sub-config), not a vision model of its own (Donut's Swin)
        tower = TOWER if "vision_config" in (getattr(cls, "sub_configs", None) or {}) else {}
        while True:
            given: dict[str, Any] = {}
            try:
                sizes = values | _named_after(cls, values)
                given = _fitting(cls, sizes | tower | _overrides(kind) | (extra or {}) | repairs)
                given = _nested_auto(cls, given, make)
                given = config_repairs.repaired_as_asked(asked, cls, given)
                return cls(**given)
            except Exception as exc:
                repair = tied_size(str(exc), values | repairs) or _listed_size(str(exc)) or _layer_indices(str(exc))
                repair = repair or _below_vocabulary(str(exc))
                if repair is None or repair[0] in repairs or len(repairs) >= 4:
                    if not config_repairs.learned(str(exc), cls, given, asked):
                        raise
                    continue
                repairs[repair[0]] = repair[1]

    try:
        config = make(model_type)
    except Exception:  # noqa: BLE001 - a check tying a size to an AutoConfig sub-config's default: those shrunk first
        config = make(model_type, _default_subs(model_type, make))
    subs = {}
    for name, sub in (getattr(type(config), "sub_configs", None) or {}).items():
        kind = getattr(getattr(config, name, None), "model_type", None)
        if name in _overrides(model_type):  # a sub-config the type's overrides give whole (a timm tower's) is kept
            continue
        if isinstance(sub, type) and sub.__name__ == "AutoConfig" and kind in modeling_auto().CONFIG_MAPPING_NAMES:
            subs[name] = make(kind, _pair_flags(config, name))
    if subs:
        config = make(model_type, subs)
    # an encoder-decoder's half of its own config class may hold sub-configs AutoConfig leaves at a checkpoint's size
    # (T5Gemma 2's encoder's SigLIP tower, 12 layers at 224 x 224): shrunk as their own type, its image tokens fitted
    halves = configs(config)[1:] if getattr(config, "is_encoder_decoder", False) else []
    for half in halves:
        for name, sub in (getattr(type(half), "sub_configs", None) or {}).items():
            kind = getattr(getattr(half, name, None), "model_type", None)
            if isinstance(sub, type) and sub.__name__ == "AutoConfig" and kind in modeling_auto().CONFIG_MAPPING_NAMES:
                setattr(half, name, make(kind))
        fit_image_tokens(half)
    vocabulary = int(first_attribute(config, "vocab_size", default=128) or 128)
    named = [name for name in vars(config) if name.endswith(("_token_id", "_token_index"))]
    free = iter(range(vocabulary - 1, 2, -1))  # the placeholders first, then the other marker tokens, from the top
    for name in [*SPECIAL_TOKENS, *sorted(set(named) - set(SPECIAL_TOKENS))]:
        value = getattr(config, name, None)
        # an image placeholder the config names but leaves unset (MiniCPM-V's ``image_token_id``, which a checkpoint
        # sets): the model skips its image without one
        unset = value is None and name in placeholder_names(config) and name in vars(config)
        if unset or (isinstance(value, int) and value >= vocabulary):
            setattr(config, name, next(free))
            for half in halves:  # the copy the config gave its halves (T5Gemma 2's encoder reads its own)
                if getattr(half, name, None) == value and value is not None:
                    setattr(half, name, getattr(config, name))
    starts = [getattr(config, name, None) for name in ("decoder_start_token_id", "bos_token_id")]
    if getattr(config, "is_encoder_decoder", False) and starts == [None, None]:
        # T5-style: a checkpoint's config.json starts the decoder from the pad token, which the class does not default
        config.decoder_start_token_id = getattr(config, "pad_token_id", None)
    fit_sizes(config)
    config_repairs.fit(config)
    return config


def _pair_flags(config: Any, name: str) -> dict[str, bool]:
    """The flags an encoder-decoder's config class gives its sub-config ``name`` by default (``sub_configs_defaults``:
    a composite's decoder ``is_decoder`` and ``add_cross_attention``, as ``from_encoder_decoder_configs`` sets them),
    which a sub-config built apart lacks: without them a composite's BERT decoder neither masks causally nor sees the
    image. Sizes are left to the shrink; other models' sub-configs are left as built."""
    if not getattr(config, "is_encoder_decoder", False):
        return {}
    spec = (getattr(type(config), "sub_configs_defaults", None) or {}).get(name)
    given = getattr(spec, "init_kwargs", None) or {}
    return {key: value for key, value in given.items() if isinstance(value, bool)}


def _named_after(cls: type, values: dict[str, Any]) -> dict[str, int]:
    """Sizes named after a shrunk size (``vocab_size_per_layer_input``, ``hidden_size_per_layer_input``: Gemma 4's
    per-layer embeddings, 262144 x 256 per layer by default; ``intermediate_size_mlp``; a linear attention's own
    ``linear_num_heads`` and ``linear_head_dim``: GLM-5 Next's 64 heads of 128, over which transformers' reference
    chunked scan took a minute per 8 generated tokens) that ``cls`` or its sub-configs take, given that size's small
    value when their default is larger."""
    found: dict[str, int] = {}
    for owner in (cls, *(sub for sub in (getattr(cls, "sub_configs", None) or {}).values() if isinstance(sub, type))):
        for name, parameter in inspect.signature(owner.__init__).parameters.items():
            default = parameter.default
            if name in values or not isinstance(default, int) or isinstance(default, bool):
                continue
            for size, small in values.items():
                named = name.startswith(f"{size}_") or name == f"linear_{size}"
                if named and isinstance(small, int) and 0 < small < default:
                    found[name] = small
    return found


#: A config's own check that two sizes agree: "`a.b` (768) must equal the backbone `c` (32)", "x must match y",
#: "`a` (64) must equal `b // 4` (8)".
_TIED = re.compile(
    r"`?([\w.]+)`? (?:\((\d+)\) )?must (?:match|equal)(?: the \w+)? `?([\w.]+)(?: // \d+)?`?(?: \((\d+)\))?"
)

#: A config's check that a token id is inside the vocabulary (Nemotron 3.5 Transcribe's ``blank_token_id``).
_BELOW_VOCABULARY = re.compile(r"`?(\w+_id)`? \((\d+)\) must be (?:a|an) \w+ below `?\w*vocab_size`? \((\d+)\)")


def _below_vocabulary(message: str) -> tuple[str, int] | None:
    """The token id a config's validation says must be below the vocabulary's size, set to its last id; None for
    another message."""
    found = _BELOW_VOCABULARY.search(message)
    return (found[1], int(found[3]) - 1) if found and int(found[3]) > 0 else None


def _default_subs(model_type: str, make: Any) -> dict[str, Any]:
    """The sub-configs ``model_type``'s config class leaves to ``AutoConfig`` with a named type
    (``sub_configs_defaults``), each shrunk as its own type (``make``): a composite whose validation ties one of its
    own sizes to its text model's (FunASR-Nano's adaptor width) fails on the text model's checkpoint default before
    the sub-configs are shrunk."""
    kinds = _auto_kinds(_transformers().CONFIG_MAPPING[model_type])
    return {name: make(kind) for name, kind in kinds.items()}


def _auto_kinds(cls: type) -> dict[str, str]:
    """The sub-configs config class ``cls`` leaves to ``AutoConfig`` with a type it names (``sub_configs_defaults``'
    specs), by name: their type."""
    specs = getattr(cls, "sub_configs_defaults", None) or {}
    mapping = modeling_auto().CONFIG_MAPPING_NAMES
    kinds = {
        name: getattr(spec, "model_type", None)
        for name, spec in specs.items()
        if getattr(getattr(spec, "config_class", None), "__name__", None) == "AutoConfig"
    }
    return {name: kind for name, kind in kinds.items() if isinstance(kind, str) and kind in mapping}


def _nested_auto(cls: type, kwargs: dict[str, Any], make: Any) -> dict[str, Any]:
    """``kwargs`` (:func:`_fitting`'s for ``cls``) with the ``AutoConfig`` sub-configs of its own sub-configs shrunk as
    their own type (``make``): Nemotron 3.5 Transcribe's audio config holds a diarization model's config, 100M
    parameters at its default."""
    for name, sub in (getattr(cls, "sub_configs", None) or {}).items():
        given = kwargs.get(name)
        if not isinstance(given, dict) or not isinstance(sub, type) or sub.__name__ == "AutoConfig":
            continue
        for inner, kind in _auto_kinds(sub).items():
            given.setdefault(inner, make(kind))
        _nested_auto(sub, given, make)
    return kwargs


def tied_size(message: str, values: dict[str, Any]) -> tuple[str, int] | None:
    """The size a config's validation says must equal another, and that other's value (from the message, or the
    shrink's own): the shrink set one side of a pair it does not know is tied (WavTokenizer's codebook and hidden
    sizes, a flow head's condition size and its backbone's). None when the message names no such pair, or the same
    name on both sides (two sub-configs' ``hidden_size``: no one value fits both)."""
    found = _TIED.search(message)
    if found is None:
        return None
    name, other = found.group(1).rsplit(".", 1)[-1], found.group(3).rsplit(".", 1)[-1]
    value = int(found.group(4)) if found.group(4) else values.get(other)
    if name == other or not isinstance(value, int):
        return None
    return name, value


#: A config's validation of a size it types as a list (Molmo2's tower ``image_size`` [height, width]) given a number.
_LISTED = re.compile(r"Field '(\w+)' with value (\d+) doesn't match any type in \(list\[int\]")


def _listed_size(message: str) -> tuple[str, list[int]] | None:
    """The size a config's validation wants as a list of ints where the shrink gave a number, as a pair of it (an
    image's height and width; a text and a vision expert's widths); None for another message."""
    found = _LISTED.search(message)
    return (found[1], [int(found[2])] * 2) if found else None


#: A config's validation of layer indices past the shrunk depth (Molmo2's adapter's ``vision_feature_layer``).
_INDEXED = re.compile(r"`?(?:[\w]+\.)*(\w+)`? \[([\d, -]+)\] must index the (\d+) layers")


def _layer_indices(message: str) -> tuple[str, list[int]] | None:
    """The layer indices a config's validation says must index its tower's few layers, as many of its last layers
    (the last first); None for another message."""
    found = _INDEXED.search(message)
    if found is None:
        return None
    count, layers = len(found[2].split(",")), int(found[3])
    return found[1], [max(0, layers - 1 - i) for i in range(count)]
