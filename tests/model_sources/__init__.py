"""The model-level suite's model lists, one module per source (timm, torchvision, transformers, diffusers).

Each module's ``cases()`` returns :class:`ModelCase` entries: a name, a family (timm module, torchvision group,
transformers kind, diffusers class) and a ``build`` function giving a model with random weights and a sample at a
small input size. Nothing is downloaded: timm ``pretrained=False``, torchvision ``weights=None`` (and
``weights_backbone=None``), transformers and diffusers from configs. ``tests/model_suite.py`` runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SOURCES = ("timm", "torchvision", "transformers", "diffusers")


@dataclass(frozen=True)
class ModelCase:
    """One model of the suite. ``build()`` returns ``(model, sample)`` where ``sample`` is what
    ``pipeline.convert`` takes (a tensor, a tuple, or ``(args, kwargs)``); ``owner`` names the work item that owns
    this model's known failures (empty when none does)."""

    source: str
    name: str
    family: str
    build: Callable[[], tuple[torch.nn.Module, Any]]
    owner: str = ""

    @property
    def id(self) -> str:
        """``source/name``: the row's key in ``docs/model_coverage.csv``."""
        return f"{self.source}/{self.name}"


def seeded(seed: int = 0) -> torch.Generator:
    """A generator for samples: the same sample every run."""
    return torch.Generator().manual_seed(seed)


def image(size: int, channels: int = 3, batch: int = 1) -> torch.Tensor:
    """A seeded image batch ``(batch, channels, size, size)``."""
    return torch.randn(batch, channels, size, size, generator=seeded())


def token_ids(length: int = 8, high: int = 100, batch: int = 1) -> torch.Tensor:
    """Seeded token ids ``(batch, length)`` below ``high``."""
    return torch.randint(3, high, (batch, length), generator=seeded())
