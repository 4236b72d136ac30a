"""timm: the smallest model (fewest parameters) of every module ``timm.list_modules()`` lists, at 64x64 where the
model takes it (``img_size=64`` for models with a fixed geometry), else at its own default input size.

The smallest model per module is computed on the meta device by :func:`smallest_per_module` and committed as
``timm_smallest.json`` beside this file (regenerate it when timm changes: ``python -m model_sources.timm_models``
from ``tests/``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from model_sources import ModelCase, image

LIST = Path(__file__).with_name("timm_smallest.json")
SMALL_SIZE = 64


def _timm() -> Any:
    import tests_environment  # noqa: F401 -- torchvision's operator schemas before timm imports torchvision
    import timm

    return timm


def smallest_per_module() -> dict[str, str]:
    """Every timm module's model with the fewest parameters (counted on the meta device: nothing allocated)."""
    timm = _timm()
    warnings.simplefilter("ignore")
    found: dict[str, str] = {}
    for module in timm.list_modules():
        sizes = {}
        for name in timm.list_models(module=module):
            try:
                with torch.device("meta"):
                    sizes[name] = sum(p.numel() for p in timm.create_model(name, pretrained=False).parameters())
            except Exception:  # a model timm cannot build without its weights or extra packages: not a candidate
                continue
        if sizes:
            found[module] = min(sizes, key=lambda n: (sizes[n], n))
    return found


def _build(name: str) -> tuple[torch.nn.Module, Any]:
    timm = _timm()
    torch.manual_seed(0)
    try:
        model = timm.create_model(name, pretrained=False, img_size=SMALL_SIZE).eval()
    except TypeError:  # no img_size argument: a convolutional model that takes any size (or a fixed one)
        model = timm.create_model(name, pretrained=False).eval()
    sample = image(SMALL_SIZE)
    if _runs(model, sample):
        return model, sample
    patch = _patch_size(model)
    if patch:  # a patch size that does not divide 64 (DeepSeek's ViT: 14): the multiple of it nearest 64
        size = patch * max(1, round(SMALL_SIZE / patch))
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, img_size=size).eval()
        sample = image(size)
        if _runs(model, sample):
            return model, sample
    torch.manual_seed(0)  # the model needs its own input size: built again at its defaults (img_size is one of them)
    model = timm.create_model(name, pretrained=False).eval()
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    return model, image(size[-1], size[0])


def _runs(model: torch.nn.Module, sample: torch.Tensor) -> bool:
    try:
        with torch.no_grad():
            model(sample)
    except Exception:  # the model does not take this input size
        return False
    return True


def _patch_size(model: torch.nn.Module) -> int:
    """The patch size of the model's first ``patch_embed`` module (``encoder.patch_embed`` too), 0 when none."""
    embed = next((m for n, m in model.named_modules() if n.split(".")[-1] == "patch_embed"), None)
    patch = getattr(embed, "patch_size", None)
    if isinstance(patch, (tuple, list)) and patch and len(set(patch)) == 1:
        patch = patch[0]
    return int(patch) if isinstance(patch, int) and patch > 1 else 0


def cases() -> list[ModelCase]:
    """One case per timm module (its smallest model), from the committed list."""
    modules = json.loads(LIST.read_text())
    return [ModelCase("timm", name, module, lambda n=name: _build(n)) for module, name in sorted(modules.items())]


if __name__ == "__main__":
    from converters.files import write_file_atomically

    write_file_atomically(LIST, (json.dumps(smallest_per_module(), indent=1, sort_keys=True) + "\n").encode())
