"""Shared test helpers. Tests use real models, real exports, real ONNX Runtime sessions and real Polygraphy."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
