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
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from model_sources import ModelCase, config_repairs, image, seeded, shrink_rules, token_ids
from model_sources.transformers_models import ARCHITECTURES, SMALL, _fitting

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

#: A shrink with more parameters than this is not small (BLT's "heads of 128" variant allocated 3 GB and ran past
#: the coverage run's deadline): refused before it is built, counted on the meta device.
MAX_PARAMETERS = 100_000_000

#: Token ids stay below this (and below the vocabulary), image-token ids and special ids above it are not drawn.
TOKENS = 8


def _modeling_auto() -> Any:
    import tests_environment  # noqa: F401 -- torchvision's operator schemas: transformers' vision models import it
    from transformers.models.auto import modeling_auto

    return modeling_auto


def _transformers() -> Any:
    _modeling_auto()
    import transformers

    return transformers


def model_types() -> list[str]:
    """Every model type transformers' ``CONFIG_MAPPING`` names, sorted."""
    return sorted(_modeling_auto().CONFIG_MAPPING_NAMES)


def _class_name(names: Any) -> str | None:
    """The class a mapping names (some map a type to several: the first)."""
    if isinstance(names, (list, tuple)):
        return str(names[0]) if names else None
    return str(names) if names else None


def model_classes(model_type: str) -> list[tuple[str, str]]:
    """``(label, class name)`` of the type's base model and of the first head of :data:`HEADS` it has."""
    auto = _modeling_auto()
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

    config = _modeling_auto().CONFIG_MAPPING_NAMES.get(model_type, "")
    name = config[: -len("Config")] + "Model" if config.endswith("Config") else ""
    return name if name and hasattr(transformers, name) else None


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
    the config's own validation ties to another (:func:`_tied_size`) is set to match it, up to four times."""
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
                sizes = values | _named_after(cls, values) | shrink_rules.repeats(cls)
                given = _fitting(cls, sizes | tower | _overrides(kind) | (extra or {}) | repairs)
                given = _nested_auto(cls, given, make)
                given = config_repairs.repaired_as_asked(asked, cls, given)
                return cls(**given)
            except Exception as exc:
                repair = _tied_size(str(exc), values | repairs) or _listed_size(str(exc)) or _layer_indices(str(exc))
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
        if isinstance(sub, type) and sub.__name__ == "AutoConfig" and kind in _modeling_auto().CONFIG_MAPPING_NAMES:
            subs[name] = make(kind, _pair_flags(config, name))
    if subs:
        config = make(model_type, subs)
    # an encoder-decoder's half of its own config class may hold sub-configs AutoConfig leaves at a checkpoint's size
    # (T5Gemma 2's encoder's SigLIP tower, 12 layers at 224 x 224): shrunk as their own type, its image tokens fitted
    halves = _configs(config)[1:] if getattr(config, "is_encoder_decoder", False) else []
    for half in halves:
        for name, sub in (getattr(type(half), "sub_configs", None) or {}).items():
            kind = getattr(getattr(half, name, None), "model_type", None)
            if isinstance(sub, type) and sub.__name__ == "AutoConfig" and kind in _modeling_auto().CONFIG_MAPPING_NAMES:
                setattr(half, name, make(kind))
        _fit_image_tokens(half)
    vocabulary = int(_attribute(config, "vocab_size", default=128) or 128)
    named = [name for name in vars(config) if name.endswith(("_token_id", "_token_index"))]
    free = iter(range(vocabulary - 1, 2, -1))  # the placeholders first, then the other marker tokens, from the top
    for name in [*SPECIAL_TOKENS, *sorted(set(named) - set(SPECIAL_TOKENS))]:
        value = getattr(config, name, None)
        # an image placeholder the config names but leaves unset (MiniCPM-V's ``image_token_id``, which a checkpoint
        # sets): the model skips its image without one
        unset = value is None and name in _placeholder_names(config) and name in vars(config)
        if unset or (isinstance(value, int) and value >= vocabulary):
            setattr(config, name, next(free))
            for half in halves:  # the copy the config gave its halves (T5Gemma 2's encoder reads its own)
                if getattr(half, name, None) == value and value is not None:
                    setattr(half, name, getattr(config, name))
    starts = [getattr(config, name, None) for name in ("decoder_start_token_id", "bos_token_id")]
    if getattr(config, "is_encoder_decoder", False) and starts == [None, None]:
        # T5-style: a checkpoint's config.json starts the decoder from the pad token, which the class does not default
        config.decoder_start_token_id = getattr(config, "pad_token_id", None)
    for owner in _configs(config):
        _fit_per_layer_sizes(owner)
        _fit_layer_counts(owner)
        _scale_sections(owner)
        _fit_groups(owner)
        _fit_stages(owner)
    _fit_image_tokens(config)
    _fit_tiles(config)
    _fit_feature_layers(config)
    for owner in _configs(config):
        _fit_layer_lists(owner)
    _fit_layer_ids(config)
    # DeepSeek-VL-Hybrid reads its high-resolution SAM tower's state after its first global layer
    # (``global_attn_indexes[0]``, 2 of (2, 5, 8, 11)), past the shrunk tower's 2 layers. Named, not general: every SAM
    # tower's global layers fitted so gives SamHQ a global layer, whose intermediate embeddings then feed a
    # projection the shrink sized for none
    high_resolution = getattr(config, "high_res_vision_config", None)
    if high_resolution is not None:
        _fit_layer_lists(high_resolution, ("_attn_indexes",), (list, tuple))
    _fit_patch_tables(config)
    _fit_tower_output(config)
    _fit_timm_towers(config)
    config_repairs.fit(config)
    return config


#: The width multiplier a timm tower is built with (timm's convolutional families take ``channel_multiplier``).
TIMM_CHANNELS = 0.1


def _fit_timm_towers(config: Any) -> None:
    """A sub-config that builds its tower from a timm ``architecture`` (Gemma 3n's MobileNetV5, 279M parameters):
    built narrower (``model_args``' ``channel_multiplier``, when the config leaves them unset), and its ``hidden_size``
    the class's own, the tower's output width, which the shrink cannot change (timm's architecture fixes it)."""
    for owner in _configs(config)[1:]:
        if not isinstance(getattr(owner, "architecture", None), str) or "model_args" not in vars(owner):
            continue
        if owner.model_args is None:
            owner.model_args = {"channel_multiplier": TIMM_CHANNELS}
        width = getattr(type(owner), "hidden_size", None)
        if isinstance(width, int) and isinstance(getattr(owner, "hidden_size", None), int):
            owner.hidden_size = width


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


def _fit_tower_output(config: Any) -> None:
    """A vision tower's output width (``out_hidden_size``: Qwen2.5-VL's merger projects to the text model's width;
    ``decoder_hidden_size``: PP-FormulaNet's, to its text decoder's) set to the shrunk text model's width; a width of
    the model's own that is the tower's default width (Kimi K2.5's ``projection_hidden_size``, the projector's input)
    set to the shrunk tower's."""
    vision, text = getattr(config, "vision_config", None), getattr(config, "text_config", None)
    width = getattr(text, "hidden_size", None)
    for name in ("out_hidden_size", "decoder_hidden_size"):
        if isinstance(getattr(vision, name, None), int) and isinstance(width, int):
            setattr(vision, name, width)
    tower = getattr(vision, "hidden_size", None)
    try:
        default = getattr(type(vision)(), "hidden_size", None) if vision is not None else None
    except Exception:  # noqa: BLE001 - a sub-config that cannot be built bare: nothing to compare with
        default = None
    if not isinstance(tower, int) or not isinstance(default, int) or default == tower:
        return
    for name, value in vars(config).items():
        if name.endswith("hidden_size") and name != "hidden_size" and value == default:
            setattr(config, name, tower)


#: Config attributes naming the vision tower's layers whose outputs a multimodal model reads.
FEATURE_LAYERS = ("vision_feature_layer", "vision_feature_layers", "select_layer", "vision_feature_select_layer")


def _fit_feature_layers(config: Any) -> None:
    """Layer indices the model reads features from (VipLLaVA's ``(-2, -5, -8, -11, 6)``) brought within the shrunk
    vision tower's hidden states (its layers and the embeddings: ``-n - 1 .. n``), each kept in order and counted
    from the same end, so that a model reading several layers still reads several."""
    vision = getattr(config, "vision_config", None)
    layers = getattr(vision, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers <= 0:
        return
    states = layers + 1  # the embeddings' output, then one per layer

    def fit(index: Any) -> Any:
        if not isinstance(index, int) or -states <= index < states:
            return index
        return max(-states, min(states - 1, index))

    for name in FEATURE_LAYERS:
        value = getattr(config, name, None)
        if isinstance(value, int):
            setattr(config, name, fit(value))
        elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
            setattr(config, name, type(value)(fit(v) for v in value))


def _fit_layer_lists(
    config: Any, suffixes: tuple[str, ...] = ("_layers", "_layers_indices"), kinds: tuple[type, ...] = (list,)
) -> None:
    """Lists of the config's own layers past its shrunk depth (Mllama's text ``cross_attention_layers`` [3, 8, ...,
    38] and its tower's ``intermediate_layers_indices`` [3, 7, 15, 23, 30] of 2 layers; names ending in ``suffixes``,
    values of ``kinds``) kept to the layers it has, or its last layer when none is left: a model whose text
    cross-attends to the image on no layer ignores the image."""
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers <= 0:
        return
    for name, value in vars(config).items():
        if not name.endswith(suffixes) or name in FEATURE_LAYERS or not isinstance(value, kinds):
            continue
        if value and all(isinstance(v, int) and v >= 0 for v in value) and max(value) >= layers:
            setattr(config, name, type(value)([v for v in value if v < layers] or [layers - 1]))


def _fit_layer_ids(config: Any) -> None:
    """A config's own layer index past its shrunk depth (a ``*_layer_id``: MiniCPM-V's tower ``insert_layer_id``, 6
    of 2 layers, where its window merger halves the patch grid: never run, while the merger after the tower reads the
    grid as halved, so a batch's second image read the first's patches) made its last layer, and so is the copy
    another of its configs holds (MiniCPM-V's top config)."""
    owners = _configs(config)
    for owner in owners:
        layers = getattr(owner, "num_hidden_layers", None)
        if not isinstance(layers, int) or layers <= 0:
            continue
        for name, value in list(vars(owner).items()):
            if name.endswith("_layer_id") and type(value) is int and value >= layers:
                for other in owners:
                    if getattr(other, name, None) == value:
                        setattr(other, name, layers - 1)


def _fit_patch_tables(config: Any) -> None:
    """A table from an image's patch count to its token count (Aria's ``projector_patch_to_query_dict``, {35 x 35: 128,
    70 x 70: 256}, the checkpoint's image sizes) keyed by the small tower's patch count instead, at most as many tokens
    as patches; a maximum the config derives from the table (``max_value_`` and its name) set to match."""
    patch = _side(_attribute(config, "patch_size", default=8) or 8)
    patches = max(1, _image_side(config) // patch) ** 2
    for owner in _configs(config):
        for name, table in list(vars(owner).items()):
            if "patch" not in name or not isinstance(table, dict) or not table or patches in table:
                continue
            if not all(isinstance(k, int) and isinstance(v, int) and v > 0 for k, v in table.items()):
                continue
            tokens = min(min(table.values()), patches)
            setattr(owner, name, {patches: tokens})
            if isinstance(getattr(owner, f"max_value_{name}", None), int):
                setattr(owner, f"max_value_{name}", tokens)


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
    mapping = _modeling_auto().CONFIG_MAPPING_NAMES
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


def _tied_size(message: str, values: dict[str, Any]) -> tuple[str, int] | None:
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


def _fit_image_tokens(config: Any) -> None:
    """A declared count of tokens per image (Gemma 3's ``mm_tokens_per_image``, 256, pooled from the tower's patch
    grid) made a square that divides the small tower's grid: the grid pooled to half its side, or kept whole."""
    count = getattr(config, "mm_tokens_per_image", None)
    vision = getattr(config, "vision_config", None)
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if not isinstance(count, int) or not isinstance(size, int) or not isinstance(patch, int) or patch <= 0:
        return
    grid = size // patch
    side = grid // 2 if grid % 2 == 0 and grid >= 2 else grid
    if count > grid * grid or grid % max(1, round(count**0.5)) != 0:
        config.mm_tokens_per_image = max(1, side) ** 2


def _fit_tiles(config: Any) -> None:
    """Tiling resolutions (LLaVA-NeXT's ``image_grid_pinpoints``, 336 x 672 and up) made the small tower's image and
    its double width: an image of the tower's size is then its own tile and a base tile, as a checkpoint's are."""
    pinpoints = getattr(config, "image_grid_pinpoints", None)
    if isinstance(pinpoints, list) and pinpoints:
        side = _image_side(config)
        config.image_grid_pinpoints = [[side, side], [side, 2 * side]]


#: The widest stage of a convolutional stack whose width doubles per stage from ``num_filters`` (the shrink's).
WIDEST_STAGE = 256


def _fit_stages(config: Any) -> None:
    """A stack of convolutional stages at its checkpoint's size, which no shrunk size reaches (VibeVoice's acoustic
    tokenizer: 6 stages of 3 to 8 blocks, its width doubling from ``num_filters`` 32 to 2048): one block per stage
    (``depths``), and a first width whose widest stage is :data:`WIDEST_STAGE` at most."""
    filters = getattr(config, "num_filters", None)
    ratios = [v for n, v in vars(config).items() if n.endswith("sampling_ratios") and isinstance(v, list | tuple)]
    if not isinstance(filters, int) or not ratios:  # not such a stack (a vision tower's ``depths`` are left)
        return
    depths = getattr(config, "depths", None)
    if isinstance(depths, list | tuple) and depths and all(isinstance(d, int) and d > 0 for d in depths):
        config.depths = type(depths)([1] * len(depths))
    if filters << len(ratios[0]) > WIDEST_STAGE:
        config.num_filters = max(1, WIDEST_STAGE >> len(ratios[0]))


def _fit_groups(config: Any) -> None:
    """A convolution's groups (``*_groups``) at the config class's default width (Mimi's ``upsample_groups``, 512: one
    group per channel) set to the shrunk width, which the default no longer divides."""
    width, default = getattr(config, "hidden_size", None), getattr(type(config), "hidden_size", None)
    if not isinstance(width, int) or not isinstance(default, int) or width == default:
        return
    for name, value in list(vars(config).items()):
        if name.endswith("_groups") and value == default and not isinstance(value, bool):
            setattr(config, name, width)


def _configs(config: Any) -> list[Any]:
    """The config and its sub-configs (one level)."""
    from transformers import PretrainedConfig

    return [config] + [value for value in vars(config).values() if isinstance(value, PretrainedConfig)]


def _global(config: Any, name: str) -> Any:
    """The config's global ``name`` (None when it has none), also where a heterogeneous config makes it per-layer
    (Gemma 4's ``head_dim``: reading ``config.head_dim`` raises there)."""
    read = getattr(config, "_getattr_without_heterogeneous_validation", None)
    return read(name, None) if callable(read) else getattr(config, name, None)


def _fit_per_layer_sizes(config: Any) -> None:
    """The per-layer sizes of a heterogeneous config (Gemma 4's full-attention layers' ``head_dim``, 512 by default
    where the others' is 256) scaled as the shrink scaled the global size: each keeps its ratio to the config class's
    default, so that the layers still differ as a checkpoint's do, at the small size."""
    spec = config.__dict__.get("_heterogeneity_spec")
    if spec is None:
        return
    overrides = {layer: dict(values) for layer, values in spec.per_layer_overrides.items()}
    for values in overrides.values():
        for name, value in values.items():
            small, default = _global(config, name), getattr(type(config), name, None)
            if all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (value, small, default)):
                values[name] = max(1, round(small * value / default))
    config.per_layer_config = overrides


def _fit_layer_counts(config: Any) -> None:
    """Counts of a config's typed layers (it lists ``layer_types``) that its shrunk depth cannot hold (Gemma 3n's
    ``num_kv_shared_layers``, 15 of 35 layers reusing earlier layers' caches: more than the 2 of the shrink) scaled
    with the depth, at least one layer and one layer fewer than the depth: the layers that share stay a part."""
    layers, default = getattr(config, "num_hidden_layers", None), getattr(type(config), "num_hidden_layers", None)
    if not isinstance(getattr(config, "layer_types", None), list) or not isinstance(layers, int) or layers < 2:
        return
    if not isinstance(default, int) or default <= layers:
        return
    for name, value in vars(config).items():
        counted = re.fullmatch(r"num_\w+_layers", name) and name != "num_hidden_layers"
        if counted and isinstance(value, int) and not isinstance(value, bool) and value > layers:
            setattr(config, name, min(layers - 1, max(1, round(value * layers / default))))


def _scale_sections(config: Any) -> None:
    """M-RoPE's ``mrope_section`` (per axis, summing to half the head size) scaled to the config's head size."""
    heads, width = getattr(config, "num_attention_heads", None), getattr(config, "hidden_size", None)
    head = _global(config, "head_dim")
    if not isinstance(head, int) and isinstance(heads, int) and isinstance(width, int) and heads:
        head = width // heads
    for name in ("rope_parameters", "rope_scaling"):
        rope = getattr(config, name, None)
        sections = rope.get("mrope_section") if isinstance(rope, dict) else None
        if not isinstance(head, int) or not isinstance(sections, list) or sum(sections) == head // 2:
            continue
        scaled = [max(1, round(x * (head // 2) / sum(sections))) for x in sections]
        scaled[0] += head // 2 - sum(scaled)
        rope["mrope_section"] = scaled


#: Token ids of placeholders a multimodal model replaces with its image or audio features.
SPECIAL_TOKENS = ("image_token_id", "image_token_index", "video_token_id", "audio_token_id", "audio_token_index")


#: The placeholder of a model whose images are a video's frames (InstructBLIP-Video's ``video_token_index``).
VIDEO_TOKENS = ("video_token_id", "video_token_index")


def _placeholder_names(config: Any) -> tuple[str, ...]:
    """The config's names of the token an image's features replace: its image token's, else its video token's (a
    model that takes its frames as ``pixel_values``)."""
    images = tuple(name for name in SPECIAL_TOKENS[:2] if name in vars(config))
    return images or tuple(name for name in VIDEO_TOKENS if name in vars(config)) or SPECIAL_TOKENS[:2]


def _attribute(config: Any, *names: str, default: Any = None) -> Any:
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


def _image_side(config: Any) -> int:
    return _side(_attribute(config, "image_size", "input_size", default=32))


def _side(size: Any) -> int:
    """One side of a size given as a number, a pair (InternVL's ``(14, 14)`` patches) or a dict with a height."""
    if isinstance(size, dict):
        size = size.get("height", 32)
    return int(size[0] if isinstance(size, (list, tuple)) else size)


def candidate_samples(model: torch.nn.Module, config: Any) -> list[dict[str, Any]]:
    """The samples to try, in order: the inputs the model's ``forward`` names, filled from its config."""
    parameters = inspect.signature(model.forward).parameters
    main = str(getattr(model, "main_input_name", "input_ids"))
    vocabulary = int(_attribute(config, "vocab_size", default=128) or 128)
    ids = token_ids(TOKENS, high=max(4, min(100, vocabulary)))
    text: dict[str, Any] = {"input_ids": ids}
    if "attention_mask" in parameters:
        text["attention_mask"] = torch.ones_like(ids)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in parameters:
        text["decoder_input_ids"] = token_ids(4, high=max(4, min(100, vocabulary)))
    decoder = {k: v for k, v in text.items() if k == "decoder_input_ids"}
    channels = int(_attribute(config, "num_channels", "in_channels", "num_input_channels", default=3) or 3)
    side = _image_side(config)
    pixels = image(side, channels)
    mels = int(_attribute(config, "num_mel_bins", "feature_size", "input_feat_per_channel", default=16) or 16)
    positions = int(_attribute(config, "max_source_positions", default=16) or 16)
    frames = _attribute(config, "max_length", default=None)
    candidates: list[dict[str, Any]] = []
    if main == "pixel_values" or ("pixel_values" in parameters and "input_ids" not in parameters):
        candidates.append({"pixel_values": pixels, **decoder})
    if main == "flattened_patches":  # the image as patches, each after its row and column (Pix2Struct's processor)
        patches = _patches_with_positions(pixels, _side(_attribute(config, "patch_size", default=8) or 8))
        over = {"attention_mask": torch.ones(patches.shape[:2], dtype=torch.long)}
        candidates.append({"flattened_patches": patches, **(over if "attention_mask" in parameters else {}), **decoder})
    if "input_ids" in parameters and ("pixel_values" in parameters or "flattened_patches" in parameters):
        placeholders = [getattr(config, name, None) for name in _placeholder_names(config)]
        placeholder = next((token for token in placeholders if token is not None), None)
        # a mask of the tokens the image's features replace, in place of a placeholder id (Kosmos-2's
        # ``image_embeds_position_mask``): the image's tokens are a marker id the text does not draw
        image_positions = [name for name in parameters if name.endswith("position_mask")]
        if placeholder is None and image_positions:
            placeholder = _free_token(config, None)
        if placeholder is None:
            candidates.append({**text, "pixel_values": pixels})
        else:  # a placeholder token per image feature: as many as the vision tower's plausible feature counts
            patch = _side(_attribute(config, "patch_size", default=8) or 8)
            grid = max(1, side // patch)
            declared = [_attribute(config, name) for name in DECLARED_IMAGE_TOKENS]
            declared = [int(count) for count in declared if isinstance(count, int) and 0 < count <= 4096]
            for images, measured in _image_layouts(model, config, pixels, parameters):
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
    required = _required_ids(parameters, ids)
    return [{**candidate, **required} for candidate in candidates]


def _token_boxes(ids: torch.Tensor) -> torch.Tensor:
    """A box per token [1, tokens, 4] (left, top, right, bottom in [0, 1]): the tokens in a row across the page."""
    count = ids.shape[1]
    left = torch.arange(count, dtype=torch.float32) / count
    top = torch.full((count,), 0.25)
    return torch.stack([left, top, left + 1 / count, top + 0.1], dim=-1)[None]


def _required_ids(parameters: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Token ids the forward requires beside ``input_ids`` (a parameter without a default whose name ends in
    ``input_ids``: InstructBLIP's ``qformer_input_ids``, the instruction its Q-Former reads with the image), the
    sample's own tokens, with an all-ones mask where the forward names one of the same prefix."""
    found: dict[str, torch.Tensor] = {}
    for name, parameter in parameters.items():
        if name == "input_ids" or not name.endswith("input_ids") or parameter.default is not parameter.empty:
            continue
        found[name] = ids.clone()
        mask = name.removesuffix("input_ids") + "attention_mask"
        if mask in parameters:
            found[mask] = torch.ones_like(ids)
    return found


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
    tiles = int(_attribute(config, "max_num_tiles", default=1) or 1)
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


def _image_layouts(
    model: torch.nn.Module, config: Any, pixels: torch.Tensor, parameters: Any
) -> list[tuple[dict[str, torch.Tensor], tuple[int, ...]]]:
    """The image inputs to try with the features each makes (:func:`_feature_count`), those the tower takes first:
    flattened patches with their grid (Qwen2-VL's), else the image [1, C, H, W], as tiles [1, tiles, C, H, W]
    (Idefics3's, LLaVA-NeXT's base and one tile) and with ``image_sizes`` where the forward takes them (Pixtral's)."""
    flattened = _flattened_patches(model, config) or _positioned_patches(model, config, parameters)
    if flattened is not None:
        return [(flattened, _feature_count(model, flattened))]
    if "pixel_values" not in parameters:  # the image as Pix2Struct's patches beside the prompt (Kosmos-2.5's)
        patches = {"flattened_patches": _patches_with_positions(pixels, _side(_attribute(config, "patch_size") or 8))}
        return [(patches, _feature_count(model, patches))]
    options = [{"pixel_values": pixels}, {"pixel_values": pixels[:, None]}, {"pixel_values": pixels.repeat(1, 2, 1, 1)}]
    options[2]["pixel_values"] = options[2]["pixel_values"].reshape(1, 2, *pixels.shape[1:])
    patches = _patches(config, pixels)
    if patches is not None:  # the image as its flattened patches [1, patches, C * p * p] (Fuyu's linear "tower")
        options.append({"pixel_values": patches})
    frames = _attribute(config, "temporal_patch_size")
    if patches is not None and isinstance(frames, int) and frames > 0:  # [patches, frames, p, p, C] (Inkling's)
        patch = _side(_attribute(config, "patch_size", default=8) or 8)
        tubes = patches[0].reshape(-1, 1, patch, patch, pixels.shape[1]).expand(-1, frames, -1, -1, -1)
        options.append({"pixel_values": tubes.contiguous()})
    features = _image_features_parameters(model)
    # the token ids the tower reads beside the image (InstructBLIP's Q-Former instruction), a second image it requires
    required = {k: v for k, v in _required_ids(parameters, token_ids(TOKENS)).items() if k in features}
    required |= _required_images(config, features, parameters, pixels)
    options = [
        {**option, **required, **_required_masks(model, option["pixel_values"], parameters)} for option in options
    ]
    if "image_sizes" in parameters:  # an optional input some towers need, others refuse
        sizes = torch.tensor([[pixels.shape[-2], pixels.shape[-1]]])
        options += [{**option, "image_sizes": sizes} for option in options]
    needed = [
        n
        for n, p in features.items()
        if p.default is p.empty and n not in ("pixel_values", *required) and n in parameters
    ]
    sized = _sized_images(config, pixels, needed) if needed else []
    options += sized[:-2]
    measured = [(option, _feature_count(model, option)) for option in options]
    # the last two (its patches side by side in one row: MiniCPM-V's) only where the tower takes them
    measured += [(option, count) for option in sized[-2:] if (count := _feature_count(model, option))]
    runs = sorted(measured, key=lambda pair: not pair[1])  # stable: the given order among those that run
    if runs and runs[0][1] and joined_images(model, runs[0][0], rows_only=True) is None:
        # the first layout's batch (one leading row per image) does not give each image's features: a layout whose
        # batch does, packed in one row if so (MiniCPM-V's processor lays the images side by side), comes first
        runs.sort(key=lambda pair: not (pair[1] and joined_images(model, pair[0]) is not None))
    return runs


def _required_masks(model: torch.nn.Module, pixels: torch.Tensor, parameters: Any) -> dict[str, torch.Tensor]:
    """A mask over the image's leading axes (images, tiles) that the base model's ``get_image_features`` requires and
    the head's leaves optional (GraniteDocling's ``pixel_attention_mask``, one per tile): every tile real."""
    method = getattr(getattr(model, "model", None), "get_image_features", None)
    if method is None or method == getattr(model, "get_image_features", None) or pixels.dim() < 5:
        return {}
    return {
        name: torch.ones(pixels.shape[:-3], dtype=torch.bool)
        for name, parameter in inspect.signature(method).parameters.items()
        if name.endswith("mask") and parameter.default is parameter.empty and name in parameters
    }


def _required_images(
    config: Any, features: dict[str, inspect.Parameter], parameters: Any, pixels: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The other images ``get_image_features`` requires beside ``pixel_values`` (a parameter without a default whose
    name ends in ``pixel_values``: DeepSeek-VL-Hybrid's ``high_res_pixel_values``, which its forward leaves
    optional), at the size of the sub-config of the same prefix (``high_res_vision_config``), else the image's."""
    found = {}
    for name, parameter in features.items():
        if name == "pixel_values" or not name.endswith("pixel_values") or parameter.default is not parameter.empty:
            continue
        if name not in parameters:
            continue
        tower = getattr(config, name.removesuffix("pixel_values") + "vision_config", None)
        side = _image_side(tower) if tower is not None else int(pixels.shape[-1])
        found[name] = image(side, int(pixels.shape[1]))
    return found


def _patches_with_positions(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """The image [1, C, H, W] as flattened patches [1, patches, 2 + p * p * C], each patch's row and column first,
    counted from 1 (0 marks a padding patch), as Pix2Struct's processor writes them."""
    channels, height, width = pixels.shape[1:]
    rows, columns = max(1, height // patch), max(1, width // patch)
    cropped = pixels[..., : rows * patch, : columns * patch].reshape(1, channels, rows, patch, columns, patch)
    flat = cropped.permute(0, 2, 4, 3, 5, 1).reshape(1, rows * columns, patch * patch * channels)
    grid = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij"), -1).reshape(1, -1, 2)
    return torch.cat([grid.to(flat.dtype) + 1, flat], dim=-1)


def _sized_images(config: Any, pixels: torch.Tensor, names: list[str]) -> list[dict[str, torch.Tensor]]:
    """The image with the inputs its ``get_image_features`` requires beside it (``names``), filled from the image's
    size: a size or shape as the image's pixels or as its grid of patches (MiniCPM-V's ``target_sizes``, LFM2-VL's
    ``spatial_shapes``), a mask all ones. The image as [1, C, H, W], as flattened patches [1, patches, C * p * p]
    with a mask per patch (NaViT towers': Siglip2's, which LFM2-VL reads), and last (two) as its patches side by side
    in one row [1, C, p, p * patches] (MiniCPM-V's, whose batch packs its images in that row: :func:`joined_images`)."""
    patch = _side(_attribute(config, "patch_size", default=8) or 8)
    height, width = pixels.shape[2:]
    rows, columns = height // patch, width // patch
    flattened = _patches(config, pixels)
    if flattened is None or any(not n.endswith(("sizes", "shapes", "mask")) for n in names):
        return []
    # the patches side by side in a row of one patch's height [1, C, p, p * patches] (MiniCPM-V's NaViT packing)
    strip = pixels[..., : rows * patch, : columns * patch].reshape(1, -1, rows, patch, columns, patch)
    strip = strip.permute(0, 1, 3, 2, 4, 5).reshape(1, -1, patch, rows * columns * patch)
    found = []
    patched = torch.ones(1, rows * columns)
    for layout, mask in ((pixels, torch.ones(1, height, width)), (flattened, patched), (strip, patched)):
        for sizes in ([[height, width]], [[rows, columns]]):
            inputs = {"pixel_values": layout}
            for name in names:
                inputs[name] = mask.to(torch.bool) if name.endswith("mask") else torch.tensor(sizes)
            found.append(inputs)
    return found


def _patches(config: Any, pixels: torch.Tensor) -> torch.Tensor | None:
    """The image [1, C, H, W] as its flattened patches [1, patches, p * p * C], rows of patches first and each patch's
    pixels channel-last, as NaViT towers and Fuyu's processor lay them out; None for an image smaller than a patch."""
    patch = _side(_attribute(config, "patch_size", default=8) or 8)
    channels, height, width = pixels.shape[1:]
    rows, columns = height // patch, width // patch
    if not rows or not columns:
        return None
    flattened = pixels[..., : rows * patch, : columns * patch].reshape(1, channels, rows, patch, columns, patch)
    return flattened.permute(0, 2, 4, 3, 5, 1).reshape(1, rows * columns, patch * patch * channels)


def _positioned_patches(model: torch.nn.Module, config: Any, parameters: Any) -> dict[str, torch.Tensor] | None:
    """One image as a tower of patches with their positions takes it (Gemma 4's: ``pixel_values`` [1, patches,
    channels * patch * patch] and ``image_position_ids`` [1, patches, 2], each patch's column and row), for a model
    whose ``get_image_features`` and forward take a ``*position_ids`` beside the image; None for any other. The image
    is twice the tower's pooling kernel (``pooling_kernel_size``) of patches each way (four pooled tokens), as the
    tower's patches, else as patches of a whole kernel each (Gemma 4 Unified's ``model_patch_size``): the first
    layout the tower takes."""
    names = [n for n in _image_features_parameters(model) if n.endswith("position_ids") and n in parameters]
    if not names:
        return None
    vision = getattr(config, "vision_config", None) or config
    patch = _side(getattr(vision, "patch_size", 8) or 8)
    channels = int(_attribute(vision, "in_channels", "num_channels", default=3) or 3)
    kernel = int(getattr(vision, "pooling_kernel_size", 1) or 1)
    layouts = []
    for side, size in dict.fromkeys(((2 * kernel, patch), (2, patch * kernel))):
        rows, columns = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        patches = _patches(SimpleNamespace(patch_size=size), image(side * size, channels))
        layouts.append({"pixel_values": patches, names[0]: torch.stack([columns, rows], -1).reshape(1, -1, 2)})
    return next((layout for layout in layouts if _feature_count(model, layout)), layouts[0])


def _image_features_method(model: torch.nn.Module) -> Any:
    owners = [model, getattr(model, "model", None)]
    return next((o.get_image_features for o in owners if hasattr(o, "get_image_features")), None)


def _image_features_parameters(model: torch.nn.Module) -> dict[str, inspect.Parameter]:
    """The named parameters of the model's ``get_image_features`` as written: an owner whose method only passes
    ``*args, **kwargs`` on (MiniCPM-V's head, to its model's) gives way to the next."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    for owner in (model, getattr(model, "model", None)):
        method = getattr(owner, "get_image_features", None)
        parameters = inspect.signature(method).parameters if method else {}
        named = {n: p for n, p in parameters.items() if p.kind not in variadic}
        if named:
            return named
    return {}


def _flattened_patches(model: torch.nn.Module, config: Any) -> dict[str, torch.Tensor] | None:
    """One image as a tower of flattened patches takes it (Qwen2-VL's and its descendants': ``pixel_values`` [patches,
    channels * frames * patch * patch] and the ``image_grid_thw`` [1, 3] of frames, rows and columns of patches), for
    a model whose ``get_image_features`` takes a ``*grid_thw`` (or a ``*grid_hw`` of rows and columns: Nemotron-H
    Omni's); None for any other. When the tower takes none of the layouts, the first whose failure is a width the
    config states apart (:func:`_width_repair`: a projector sized for the unmerged patches) is the sample's, for the
    build to repair."""
    grids = [n for n in _image_features_parameters(model) if n.endswith(("grid_thw", "grid_hw"))]
    if not grids:
        return None
    vision = getattr(config, "vision_config", None) or config
    patch = int(getattr(vision, "patch_size", 8) or 8)
    frames = int(getattr(vision, "temporal_patch_size", 1) or 1)
    channels = int(_attribute(vision, "in_channels", "num_channels", "in_chans", default=3) or 3)
    merge = int(_attribute(vision, "spatial_merge_size", "merge_size", default=1) or 1)
    side = 2 * merge  # rows and columns of patches: two merged tokens each way
    # the grid of patches, then of merged tokens (Inkling 2's, whose tower multiplies it by the merge)
    sides = dict.fromkeys((side, side // merge))
    options = [{grids[0]: torch.tensor([[1, s, s] if grids[0].endswith("thw") else [s, s]])} for s in sides]
    merges = grids[0].removesuffix("grid_thw") + "merge_sizes"  # the merge per image (Video-LLaMA 3's)
    if merges in inspect.signature(model.forward).parameters:
        options = [{**grid, merges: torch.tensor([merge])} for grid in options]
    count = side * side
    layouts = (  # as the tower reads its patches: flattened (with its frames, or two), or as small images
        (count, channels * frames * patch * patch),
        (count, channels * 2 * patch * patch),
        (count, channels, patch, patch),
        (count, channels, frames, patch, patch),
        (1, count, channels, patch, patch),
        # a merged token's pixels, channels last (Inkling 2's: one image per token of the prompt)
        (count // merge**2, patch * merge, patch * merge, channels),
    )
    fallback = None
    for grid in options:
        for layout in dict.fromkeys(layouts):
            images = {"pixel_values": torch.randn(*layout, generator=seeded()), **grid}
            if _feature_count(model, images):
                return images
            if fallback is None and _width_repair(config, _features_error(model, images)) is not None:
                fallback = images
    return fallback or {"pixel_values": torch.randn(*layouts[0], generator=seeded()), **options[0]}


def _features_error(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> str:
    """The error of the model's ``get_image_features`` on ``images`` ("" when it runs or there is none)."""
    method = _image_features_method(model)
    try:
        with torch.no_grad():
            method(**images) if method is not None else None
    except Exception as exc:  # noqa: BLE001 - its message is what the caller reads
        return str(exc)
    return ""


def _feature_count(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> tuple[int, ...]:
    """How many features the model's own ``get_image_features`` makes of one image (the placeholder tokens it
    replaces), or () when it has none or refuses the image alone."""
    features = _features(model, images)
    count = sum(int(piece.shape[0]) for piece in features) if features is not None else 0
    return (count,) if 0 < count <= 4096 else ()


def _features(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> list[torch.Tensor] | None:
    """The features the model's own ``get_image_features`` makes of ``images``, as pieces [tokens, hidden] in order,
    or None when it has none or refuses them."""
    method = _image_features_method(model)
    if method is None:
        return None
    try:
        with torch.no_grad():
            features = method(**images)
    except Exception:  # noqa: BLE001 - a tower that needs more than the image: the guessed counts follow
        return None
    # the features the prompt takes: pooled, else the tower's last state (Fuyu's patch embeddings, no pooled output)
    pooled = getattr(features, "pooler_output", None)
    features = pooled if pooled is not None else getattr(features, "last_hidden_state", features)
    if isinstance(features, (list, tuple)):
        return [f.reshape(-1, f.shape[-1]) for f in features if isinstance(f, torch.Tensor)]
    if isinstance(features, torch.Tensor) and features.dim() >= 2:
        return [features.reshape(-1, features.shape[-1])]
    return None


def joined_images(
    model: torch.nn.Module,
    first: dict[str, torch.Tensor],
    second: dict[str, torch.Tensor] | None = None,
    rows_only: bool = False,
) -> dict[str, torch.Tensor] | None:
    """The image inputs of a batch of two images, ``first``'s then ``second``'s (by default: ``first``'s drawn again),
    laid out so that the model's ``get_image_features`` gives each image's own features, in order: stacked on the
    leading axis (one row per image), else (unless ``rows_only``) the floating inputs joined along their last axis
    and the others stacked (NaViT packing in one row: MiniCPM-V's ``pixel_values`` [1, C, p, p * patches of both]
    with ``target_sizes`` [2, 2]); None when neither does, as found by running the model."""
    if second is None:
        drawn = seeded(5)
        second = {n: torch.randn(v.shape, generator=drawn) if v.is_floating_point() else v for n, v in first.items()}
    pieces = [_features(model, first), _features(model, second)]
    if pieces[0] is None or pieces[1] is None:
        return None
    expected = torch.cat([*pieces[0], *pieces[1]])
    for packed in (False,) if rows_only else (False, True):
        joined = {
            name: torch.cat([value, second[name]], dim=-1 if packed and value.is_floating_point() else 0)
            for name, value in first.items()
        }
        found = _features(model, joined)
        got = torch.cat(found) if found else None
        if got is not None and got.shape == expected.shape and torch.allclose(got, expected, atol=1e-4, rtol=1e-3):
            return joined
    return None


def build(model_type: str, class_name: str) -> tuple[torch.nn.Module, Any]:
    """The model (random weights, eval mode) of the first :data:`VARIANTS` shrink it builds and runs with, on the first
    candidate sample it runs on; raises with every variant's first error when none runs. A model whose forward takes
    images but ran on text alone tries the other shrinks for a sample with an image first (a tower sized for its
    config's own image: Aria's)."""
    errors = []
    text_only = None
    for variant, (name, _sizes, _kept) in enumerate(VARIANTS):
        try:
            model, sample = _build(model_type, class_name, variant)
        except Exception as exc:  # noqa: BLE001 - the next shrink; all are reported when none runs
            errors.append(f"[{name}] {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            continue
        _cached_generation(model, sample[1])
        takes_images = "pixel_values" in inspect.signature(model.forward).parameters
        if not takes_images or "pixel_values" in sample[1]:
            return model, sample
        text_only = text_only or (model, sample)
    if text_only is not None:
        return text_only
    raise RuntimeError(f"{class_name} does not run eagerly from a small config: " + " || ".join(errors))


def _cached_generation(model: torch.nn.Module, sample: dict[str, Any]) -> None:
    """``generate`` with the key-value cache, as checkpoints generate. :data:`SMALL`'s ``use_cache=False`` (the
    forward sample returns no cache) is in the generation config of a model whose own config has ``use_cache``
    (Janus's, DeepSeek-VL's): ``generate`` then ran the whole prompt and its image again at every step, and a generated
    token that is the image placeholder failed the model's count of image tokens. The forward keeps the config's.
    Caching stays off for a model whose cache ``generate`` cannot read (Qwen3.5's shrink, whose two layers are both
    linear attention: its cache has no length)."""
    generation = getattr(model, "generation_config", None)
    if generation is None or generation.use_cache is not False:
        return
    try:
        with torch.no_grad():
            output = model(**sample, use_cache=True)
        cache = getattr(output, "past_key_values", None) or getattr(output, "cache", None)
        cache.get_seq_length()
    except Exception:  # noqa: BLE001 - no cache generate can use: it keeps generating without one
        return
    generation.use_cache = True


#: transformers' error for M-RoPE sections a model's code defaults to (GLM-4V's 8 + 12 + 12) that the head does not fit.
SECTIONS_ERROR = re.compile(r"split_sizes to sum exactly to (\d+) .*but got split_sizes=\[([\d, ]+)\]")

#: A model's error for M-RoPE sections its config leaves to the checkpoint (HunYuan-VL's, none by default).
NO_SECTIONS_ERROR = re.compile(r"expects at least (\d+) multimodal RoPE axes, got 0")

#: A token id the model's code reads from a config class that does not define it (Qwen2.5-Omni's thinker reads
#: ``vision_start_token_id``, which only the whole Omni model's config has).
MISSING_TOKEN_ERROR = re.compile(r"'(\w+)' object has no attribute '(\w+_token_(?:id|index))'")


def _build(
    model_type: str,
    class_name: str,
    variant: int,
    sections: list[int] | None = None,
    tokens: dict[tuple[str, str], int] | None = None,
    widths: dict[tuple[str, str], int] | None = None,
) -> tuple[torch.nn.Module, Any]:
    import transformers

    config = shrunk(model_type, variant)
    for owner in _configs(config) if sections else ():  # the code's default sections, scaled to the small head
        if isinstance(getattr(owner, "rope_parameters", None), dict):
            owner.rope_parameters["mrope_section"] = sections
    # the token ids the code reads and the config lacks, the widths a layer is fed (:func:`_width_repair`)
    for (owner_name, name), value in {**(tokens or {}), **(widths or {})}.items():
        for owner in _configs(config):
            if type(owner).__name__ == owner_name:
                setattr(owner, name, value)
    cls = getattr(transformers, class_name)
    with torch.device("meta"):  # counted before a byte is allocated: a shrink that is not small is refused
        size = sum(p.numel() for p in cls(config).parameters())
    if size > MAX_PARAMETERS:
        raise RuntimeError(f"the shrunk model has {size / 1e6:.0f}M parameters (more than {MAX_PARAMETERS / 1e6:.0f}M)")
    torch.manual_seed(0)
    model = cls(config).eval()
    redraw_constant_matrices(model, float(_attribute(config, "initializer_range", default=0.02) or 0.02))
    open_gates(model)
    errors = []
    candidates = candidate_samples(model, config)
    for index, sample in enumerate(candidates):
        try:
            with torch.no_grad(), UngroupedKeys() as keys:
                model(**sample)
        except Exception as exc:  # noqa: BLE001 - the next candidate; all of them are reported when none runs
            found, unset = SECTIONS_ERROR.search(str(exc)), NO_SECTIONS_ERROR.search(str(exc))
            if found and sections is None:
                return _build(model_type, class_name, variant, _scaled(found[2], int(found[1])), tokens, widths)
            if unset and sections is None:  # as many axes as the model asks for, sharing the small head
                total = _head_size(getattr(config, "text_config", None) or config) // 2
                sections = _scaled(", ".join("1" * int(unset[1])), total)
                return _build(model_type, class_name, variant, sections, tokens, widths)
            width = _width_repair(config, str(exc)) or config_repairs.forward_repair(_configs(config), str(exc))
            if width is not None and len(widths or {}) < 3:
                return _build(model_type, class_name, variant, sections, tokens, {**(widths or {}), **width})
            recounted = _recounted(config, sample, str(exc))
            if recounted is not None and len(candidates) < 64:  # next: one placeholder per feature the model made
                candidates.insert(index + 1, recounted)
            missing = MISSING_TOKEN_ERROR.search(str(exc))
            if missing and (missing[1], missing[2]) not in (tokens or {}) and len(tokens or {}) < 4:
                free = {**(tokens or {}), (missing[1], missing[2]): _free_token(config, tokens)}
                return _build(model_type, class_name, variant, sections, free, widths)
            errors.append(f"{sorted(sample)}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
            continue
        found = keys.found or _audio_keys(model, candidates)
        if found:  # not a config a checkpoint has: the next shrink (key-value heads = heads) is
            raise RuntimeError(found)
        return model, ((), sample)
    raise RuntimeError("no candidate sample runs: " + " | ".join(errors))


#: transformers' check that a prompt holds one placeholder per image feature.
COUNT_ERROR = re.compile(r"features and image tokens do not match,? tokens: (\d+), features: (\d+)")


def _recounted(config: Any, sample: dict[str, Any], message: str) -> dict[str, Any] | None:
    """The sample with as many image placeholders as the model's own count check says it made features (Granite 4
    Vision's, whose ``get_image_features`` returns its features by decoder layer, not counted beforehand), its per-token
    inputs made again from the new prompt; None for another error, or a sample without placeholders."""
    found = COUNT_ERROR.search(message)
    placeholder = next((getattr(config, n) for n in _placeholder_names(config) if getattr(config, n, None)), None)
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


def _width_repair(config: Any, message: str) -> dict[tuple[str, str], int] | None:
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

    holders = [(owner, name) for owner in _configs(config) for name, value in sizes(owner).items() if value == expected]
    if len(holders) > 1:  # the layer's own config states its output width too
        holders = [(owner, name) for owner, name in holders if output in sizes(owner).values()]
    if len(holders) > 1:  # a width stated apart, not one of the shrink's sizes (Muse Spark's ``out_hidden_size``)
        holders = [(owner, name) for owner, name in holders if name not in SMALL] or holders
    return {(type(holders[0][0]).__name__, holders[0][1]): fed} if len(holders) == 1 else None


def open_gates(model: torch.nn.Module) -> list[str]:
    """Set every gate parameter initialised to zero (named ``gate`` or ``alpha``, one value per gate: Mllama's and
    IDEFICS's tanh gates on the text's cross-attention to the image) to 1, and return their names. transformers
    starts them closed, as training does; a trained checkpoint's are open, and a closed gate shuts the image out of
    the logits."""
    opened = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            last = name.rsplit(".", 1)[-1]
            named = "gate" in last or last.startswith("alpha")
            if named and parameter.dim() <= 1 and parameter.is_floating_point() and not parameter.any():
                parameter.fill_(1.0)
                opened.append(name)
    return opened


def _head_size(config: Any) -> int:
    """The config's attention head size: its ``head_dim``, else its width over its heads."""
    head = getattr(config, "head_dim", None)
    if isinstance(head, int):
        return head
    return int(getattr(config, "hidden_size", 32) or 32) // int(getattr(config, "num_attention_heads", 2) or 2)


def _free_token(config: Any, taken: dict[Any, int] | None) -> int:
    """The highest token id below the vocabulary that no token id of the config (nor ``taken``) is: a marker token
    the sample's text does not draw (its ids stay below 100)."""
    vocabulary = int(_attribute(config, "vocab_size", default=128) or 128)
    used = set((taken or {}).values())
    for owner in _configs(config):
        used |= {v for n, v in vars(owner).items() if n.endswith(("_token_id", "_token_index")) and isinstance(v, int)}
    return next(token for token in range(vocabulary - 1, 2, -1) if token not in used)


def _scaled(sections: str, total: int) -> list[int]:
    """Sections (``"8, 12, 12"``) scaled to sum to ``total``, each at least 1."""
    values = [int(x) for x in sections.split(",")]
    scaled = [max(1, round(x * total / sum(values))) for x in values]
    scaled[0] += total - sum(scaled)
    return scaled


def _audio_keys(model: torch.nn.Module, candidates: list[dict[str, Any]]) -> str | None:
    """:class:`UngroupedKeys`' finding on the model's ``get_audio_features`` (its audio tower, which a sample of text
    alone does not run: Nemotron 3.5 Transcribe's) on the first candidate audio it runs on, a mask of every frame for
    each other input it takes (over the last axis, else the second); None without the method or a finding."""
    method = getattr(model, "get_audio_features", None)
    if not callable(method):
        return None
    masks = [n for n in inspect.signature(method).parameters if n.endswith("mask")]
    for candidate in candidates:
        audio = candidate.get("input_features")
        if not isinstance(audio, torch.Tensor) or audio.dim() != 3:
            continue
        for frames in dict.fromkeys((audio.shape[-1], audio.shape[1])):
            try:
                with torch.no_grad(), UngroupedKeys() as keys:
                    method(audio, **{n: torch.ones(1, frames, dtype=torch.long) for n in masks})
            except Exception:  # noqa: BLE001 - the next layout
                continue
            return keys.found
    return None


class UngroupedKeys(torch.overrides.TorchFunctionMode):
    """Watches grouped-query attention calls (``enable_gqa=True``) for keys and values not grouped as the config's
    ``num_key_value_heads`` says: keys with as many heads as the queries (multi-head latent attention expands them per
    query head) or keys and values with different head counts. PyTorch's eager attention takes these (one group of
    one), but transformers' traced path repeats them by the config's groups and torch.export fails on a shape no
    checkpoint has (real configs of these types pair key-value heads with heads one to one)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: str | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention and kwargs.get("enable_gqa") and len(args) >= 3:
            query, key, value = args[:3]
            heads = (query.shape[-3], key.shape[-3], value.shape[-3])
            if self.found is None and heads[0] != 1 and (heads[1] == heads[0] or heads[1] != heads[2]):
                self.found = (
                    f"grouped-query attention on keys not grouped as num_key_value_heads says (query, key, value "
                    f"heads {heads}): the shrink's key-value heads do not fit the model"
                )
        return func(*args, **kwargs)


def redraw_constant_matrices(model: torch.nn.Module, std: float) -> list[str]:
    """Draw again (normal, ``std``, seeded) every weight of two or more dimensions whose elements are all equal,
    and return their names. transformers initialises some to zeros (AFMoE's router gate, adaLN-zero projections):
    a trained checkpoint never has them so, and a zero router scores every expert alike, so its top-k picks among
    ties, whose order PyTorch and ONNX do not share (PyTorch took experts 2 and 3 of 4, ONNX's TopK 0 and 1). One-
    dimensional parameters (biases, norms, AFMoE's expert bias) keep their values."""
    generator = seeded()
    redrawn = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() < 2 or parameter.numel() < 2 or not parameter.is_floating_point():
                continue
            flat = parameter.reshape(-1)
            if bool((flat == flat[0]).all()):
                drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float32) * std
                parameter.copy_(drawn.to(parameter.dtype))
                redrawn.append(name)
    return redrawn


def family_of(model_type: str) -> str:
    """The type's family, read from its config class's defaults and transformers' mappings."""
    auto = _modeling_auto()
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
        if any(_attribute(config, name) for name in ("num_experts", "num_local_experts", "n_routed_experts")):
            return "moe"
        if _attribute(config, "state_size", "ssm_state_size", "mamba_d_state", "d_state") is not None:
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
