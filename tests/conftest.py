"""Shared test helpers. Tests use real models, real exports, real ONNX Runtime sessions and real Polygraphy."""

from __future__ import annotations

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before anything imports torchvision
import torch


def pytest_configure(config: pytest.Config) -> None:
    """Polygraphy binds one TensorRT library per process, on the first import of ``polygraphy.backend.trt``
    (``pipeline.runtime.tensorrt.library``). The tests build with TensorRT-RTX, the library that installs here: bind
    it before any test runs, so that a test importing Polygraphy's TensorRT loaders without building (a profile test)
    cannot bind the other library for the rest of its worker process, whatever order the files run in."""
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX, bind_polygraphy

    if TENSORRT_RTX.importable():
        bind_polygraphy(TENSORRT_RTX)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
