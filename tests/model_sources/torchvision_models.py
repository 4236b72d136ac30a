"""torchvision's classification, segmentation, video and optical-flow models (``weights=None``,
``weights_backbone=None``) at small input sizes: 64x64 images, where a model's fixed geometry allows it."""

from __future__ import annotations

from typing import Any

import torch

from model_sources import ModelCase, image, seeded

# Models whose architecture fixes or floors the input size (the smallest size each one takes).
_IMAGE_SIZE = {"inception_v3": 96, "maxvit_t": 224, "googlenet": 64}
# Keyword arguments that shrink a model's fixed geometry to the small input.
_KWARGS: dict[str, dict[str, Any]] = {
    "vit_b_16": {"image_size": 64},
    "vit_b_32": {"image_size": 64},
    "vit_l_16": {"image_size": 64},
    "vit_l_32": {"image_size": 64},
    "vit_h_14": {"image_size": 56},
    "inception_v3": {"aux_logits": False, "init_weights": False},
    "googlenet": {"aux_logits": False, "init_weights": False},
}
# s3d pools a 2 x 7 x 7 window after downsampling 8 x 32 x 32: 16 frames of 224 x 224 at least
_VIDEO_SHAPE = {"mvit_v1_b": (1, 3, 16, 224, 224), "mvit_v2_s": (1, 3, 16, 224, 224), "s3d": (1, 3, 16, 224, 224)}


def _models() -> Any:
    import tests_environment  # noqa: F401 -- torchvision's operator schemas before torchvision
    import torchvision

    return torchvision.models


def _classification(name: str) -> tuple[torch.nn.Module, Any]:
    models = _models()
    torch.manual_seed(0)
    model = models.get_model(name, weights=None, **_KWARGS.get(name, {}))
    size = _KWARGS.get(name, {}).get("image_size", _IMAGE_SIZE.get(name, 64))
    return model.eval(), image(size)


def _segmentation(name: str) -> tuple[torch.nn.Module, Any]:
    models = _models()
    torch.manual_seed(0)
    model = models.get_model(name, weights=None, weights_backbone=None, aux_loss=False)
    return model.eval(), image(64)


def _video(name: str) -> tuple[torch.nn.Module, Any]:
    models = _models()
    torch.manual_seed(0)
    model = models.get_model(name, weights=None)
    shape = _VIDEO_SHAPE.get(name, (1, 3, 4, 64, 64))
    return model.eval(), torch.randn(*shape, generator=seeded())


def _optical_flow(name: str) -> tuple[torch.nn.Module, Any]:
    models = _models()
    torch.manual_seed(0)
    model = models.get_model(name, weights=None)
    first, second = image(128), torch.randn(1, 3, 128, 128, generator=seeded(1))
    return model.eval(), ((first, second), {"num_flow_updates": 4})


_GROUPS = (
    ("classification", None, _classification),
    ("segmentation", "segmentation", _segmentation),
    ("video", "video", _video),
    ("optical_flow", "optical_flow", _optical_flow),
)


def cases() -> list[ModelCase]:
    """Every model torchvision lists in the four groups, by name."""
    models = _models()
    found = []
    for family, module, build in _GROUPS:
        where = getattr(models, module) if module else models
        for name in models.list_models(module=where):
            found.append(ModelCase("torchvision", name, family, lambda n=name, b=build: b(n)))
    return found
