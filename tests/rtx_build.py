"""Test support: does the real TensorRT-RTX builder build a graph? (CPU-only AOT build, no GPU needed.)

Tests that call these skip, with the reason, where ``tensorrt_rtx`` does not import; CI has it (the dev extra).
The build itself is :func:`pipeline.precision.buildable.build_error` (parse with per-node parser errors, the
optimization profiles from the declared dynamic dims and profiles, build); the lead merges that with the TensorRT-RTX
backend.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import pytest

import pipeline
from converters.settings import DynamicDim, ProfileRange
from pipeline.precision.buildable import build_error, rtx_available

SKIP_REASON = "TensorRT-RTX is not installed (pip install 'tensorrt-rtx==1.7.1.116'; CI has it in the dev extra)"


def rtx_build_error(
    model: onnx.ModelProto,
    dynamic: Sequence[DynamicDim] = (),
    profiles: tuple[tuple[ProfileRange, ...], ...] = (),
) -> str | None:
    """None when TensorRT-RTX parses and builds ``model`` (one optimization profile per entry of ``profiles``),
    else the parser's per-node errors or the builder's log; skips the calling test when TensorRT-RTX does not
    import."""
    if not rtx_available():
        pytest.skip(SKIP_REASON)
    return build_error(model, dynamic, profiles)


def assert_builds(module: pipeline.ConvertedModule) -> None:
    """The converted module's final graph (``module.onnx``) builds with the real builder, dynamic dims and
    optimization profiles included."""
    error = rtx_build_error(module.onnx, module.settings.dynamic, module.settings.profiles)
    precision = module.settings.precision
    assert error is None, f"TensorRT-RTX rejects the final {precision} graph: {error}"
