"""The image inputs of the every-type source's samples (:mod:`model_sources.transformers_all_models`), found by running
the model's own ``get_image_features``: the layouts a tower takes (:func:`image_layouts`: the image, as tiles, as
flattened patches with their grid or positions, as NaViT patches with their sizes, with the other inputs the tower
requires) with the features each makes, and a batch of two images laid out so that each gets its own features
(:func:`joined_images`)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import torch

from model_sources import image, seeded, token_ids
from model_sources.transformers_all_config import TOKENS, first_attribute, image_side, side_of
from model_sources.transformers_all_repairs import width_repair


def required_ids(parameters: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
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


def image_layouts(
    model: torch.nn.Module, config: Any, pixels: torch.Tensor, parameters: Any
) -> list[tuple[dict[str, torch.Tensor], tuple[int, ...]]]:
    """The image inputs to try with the features each makes (:func:`_feature_count`), those the tower takes first:
    flattened patches with their grid (Qwen2-VL's), else the image [1, C, H, W], as tiles [1, tiles, C, H, W]
    (Idefics3's, LLaVA-NeXT's base and one tile) and with ``image_sizes`` where the forward takes them (Pixtral's)."""
    flattened = _flattened_patches(model, config) or _positioned_patches(model, config, parameters)
    if flattened is not None:
        return [(flattened, _feature_count(model, flattened))]
    if "pixel_values" not in parameters:  # the image as Pix2Struct's patches beside the prompt (Kosmos-2.5's)
        patches = {
            "flattened_patches": patches_with_positions(pixels, side_of(first_attribute(config, "patch_size") or 8))
        }
        return [(patches, _feature_count(model, patches))]
    options = [{"pixel_values": pixels}, {"pixel_values": pixels[:, None]}, {"pixel_values": pixels.repeat(1, 2, 1, 1)}]
    options[2]["pixel_values"] = options[2]["pixel_values"].reshape(1, 2, *pixels.shape[1:])
    patches = _patches(config, pixels)
    if patches is not None:  # the image as its flattened patches [1, patches, C * p * p] (Fuyu's linear "tower")
        options.append({"pixel_values": patches})
    frames = first_attribute(config, "temporal_patch_size")
    if patches is not None and isinstance(frames, int) and frames > 0:  # [patches, frames, p, p, C] (Inkling's)
        patch = side_of(first_attribute(config, "patch_size", default=8) or 8)
        tubes = patches[0].reshape(-1, 1, patch, patch, pixels.shape[1]).expand(-1, frames, -1, -1, -1)
        options.append({"pixel_values": tubes.contiguous()})
    features = _image_features_parameters(model)
    # the token ids the tower reads beside the image (InstructBLIP's Q-Former instruction), a second image it requires
    required = {k: v for k, v in required_ids(parameters, token_ids(TOKENS)).items() if k in features}
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
        side = image_side(tower) if tower is not None else int(pixels.shape[-1])
        found[name] = image(side, int(pixels.shape[1]))
    return found


def patches_with_positions(pixels: torch.Tensor, patch: int) -> torch.Tensor:
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
    patch = side_of(first_attribute(config, "patch_size", default=8) or 8)
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
    patch = side_of(first_attribute(config, "patch_size", default=8) or 8)
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
    patch = side_of(getattr(vision, "patch_size", 8) or 8)
    channels = int(first_attribute(vision, "in_channels", "num_channels", default=3) or 3)
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
    config states apart (:func:`width_repair`: a projector sized for the unmerged patches) is the sample's, for the
    build to repair."""
    grids = [n for n in _image_features_parameters(model) if n.endswith(("grid_thw", "grid_hw"))]
    if not grids:
        return None
    vision = getattr(config, "vision_config", None) or config
    patch = int(getattr(vision, "patch_size", 8) or 8)
    frames = int(getattr(vision, "temporal_patch_size", 1) or 1)
    channels = int(first_attribute(vision, "in_channels", "num_channels", "in_chans", default=3) or 3)
    merge = int(first_attribute(vision, "spatial_merge_size", "merge_size", default=1) or 1)
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
            if fallback is None and width_repair(config, _features_error(model, images)) is not None:
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
