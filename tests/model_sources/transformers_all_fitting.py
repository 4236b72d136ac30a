"""Fitting a shrunk config for the every-type source (:mod:`model_sources.transformers_all_models`): the sizes a config
derives from the ones the shrink set, or states apart from them at a checkpoint's value (layer lists and indices past
the shrunk depth, tokens per image, tiles, patch tables, M-RoPE sections, per-layer sizes, convolution groups and
stages, a tower's output width, timm towers), brought to the small model (:func:`fit_sizes`), nothing named by model
type."""

from __future__ import annotations

import re
from typing import Any

from model_sources.transformers_all_config import configs, first_attribute, image_side, side_of


def fit_sizes(config: Any) -> None:
    """The sizes a shrunk config (and its sub-configs) derives from the ones the shrink set, or states apart from them,
    fitted to the small model, in order: per-layer sizes, layer counts, M-RoPE sections, convolution groups and stages,
    tokens per image, tiles, feature layers, layer lists and indices, patch tables, the tower's output width, timm
    towers."""
    for owner in configs(config):
        _fit_per_layer_sizes(owner)
        _fit_layer_counts(owner)
        _scale_sections(owner)
        _fit_groups(owner)
        _fit_stages(owner)
    fit_image_tokens(config)
    _fit_tiles(config)
    _fit_feature_layers(config)
    for owner in configs(config):
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


#: The width multiplier a timm tower is built with (timm's convolutional families take ``channel_multiplier``).
TIMM_CHANNELS = 0.1


def _fit_timm_towers(config: Any) -> None:
    """A sub-config that builds its tower from a timm ``architecture`` (Gemma 3n's MobileNetV5, 279M parameters):
    built narrower (``model_args``' ``channel_multiplier``, when the config leaves them unset), and its ``hidden_size``
    the class's own, the tower's output width, which the shrink cannot change (timm's architecture fixes it)."""
    for owner in configs(config)[1:]:
        if not isinstance(getattr(owner, "architecture", None), str) or "model_args" not in vars(owner):
            continue
        if owner.model_args is None:
            owner.model_args = {"channel_multiplier": TIMM_CHANNELS}
        width = getattr(type(owner), "hidden_size", None)
        if isinstance(width, int) and isinstance(getattr(owner, "hidden_size", None), int):
            owner.hidden_size = width


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
    owners = configs(config)
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
    patch = side_of(first_attribute(config, "patch_size", default=8) or 8)
    patches = max(1, image_side(config) // patch) ** 2
    for owner in configs(config):
        for name, table in list(vars(owner).items()):
            if "patch" not in name or not isinstance(table, dict) or not table or patches in table:
                continue
            if not all(isinstance(k, int) and isinstance(v, int) and v > 0 for k, v in table.items()):
                continue
            tokens = min(min(table.values()), patches)
            setattr(owner, name, {patches: tokens})
            if isinstance(getattr(owner, f"max_value_{name}", None), int):
                setattr(owner, f"max_value_{name}", tokens)


def fit_image_tokens(config: Any) -> None:
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
        side = image_side(config)
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
