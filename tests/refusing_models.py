"""Test support: models PyTorch itself refuses some inputs of (validation and comparison drop such drawn inputs).

Shared by ``tests/pipeline/validation/test_screening.py`` (validation) and ``tests/pipeline/test_compare_screening.py``
(``pipeline.compare``)."""

from __future__ import annotations

import torch
from torch import nn


class ShiftedCrossEntropy(nn.Module):
    """Takes x in [-1, 1] only: the sample is, but it is signed, so its draws are plain normals."""

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy((x + 1) / 2, target, reduction="none")


class LowerCholesky(nn.Module):
    """linalg.cholesky reads the lower triangle only: a non-symmetric sample is taken, its draws are not."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.linalg.cholesky(a)


#: A sample ShiftedCrossEntropy takes: x in [-1, 1] and 0/1 targets.
X, TARGET = torch.tensor([-0.9, 0.8, 0.95, -0.7]), torch.tensor([0.0, 1.0, 1.0, 0.0])
