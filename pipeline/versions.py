"""Versions of the libraries a conversion depends on, recorded in reports and artifacts."""

from __future__ import annotations

import functools
import importlib.metadata


def library_versions() -> dict[str, str]:
    """``{distribution: version}`` of the libraries a conversion depends on that are installed here (read once per
    process: each read parses the packages' metadata files, 60 ms of every conversion)."""
    return dict(_read_versions())


@functools.cache
def _read_versions() -> dict[str, str]:
    versions = {}
    for dist in ("torch", "onnx", "onnxruntime", "onnx-graphsurgeon", "polygraphy", "onnxscript", "tensorrt"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        versions["torch-trt-pipeline"] = importlib.metadata.version("torch-trt-pipeline")
    except importlib.metadata.PackageNotFoundError:
        versions["torch-trt-pipeline"] = "source"
    return versions
