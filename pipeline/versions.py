"""Versions of the libraries a conversion depends on, recorded in reports and artifacts."""

from __future__ import annotations

import importlib.metadata


def library_versions() -> dict[str, str]:
    """``{distribution: version}`` of the libraries a conversion depends on that are installed here."""
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
