"""Versions of the libraries a conversion depends on, recorded in reports and artifacts."""

from __future__ import annotations

import functools
import importlib.metadata

#: The libraries whose versions an artifact records (``tensorrt`` and the others only where installed).
LIBRARIES = ("torch", "onnx", "onnxruntime", "onnx-graphsurgeon", "polygraphy", "onnxscript", "tensorrt")


def library_versions() -> dict[str, str]:
    """``{distribution: version}`` of the libraries a conversion depends on that are installed here (read once per
    process)."""
    return dict(_read_versions())


@functools.cache
def _read_versions() -> dict[str, str]:
    versions = {}
    for dist in LIBRARIES:
        try:
            versions[dist] = distribution_version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        versions["torch-trt-pipeline"] = distribution_version("torch-trt-pipeline")
    except importlib.metadata.PackageNotFoundError:
        versions["torch-trt-pipeline"] = "source"
    return versions


def distribution_version(name: str) -> str:
    """``importlib.metadata.version(name)``, read from the ``Version`` header of the distribution's metadata file
    without parsing the rest: ``importlib.metadata`` parses the whole file as an e-mail message, long description
    included (5-10 ms a package, 60 ms for the libraries above; a load paid it while it imported the runtime)."""
    dist = importlib.metadata.distribution(name)
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    for line in text.splitlines():
        if not line.strip():  # the end of the headers
            break
        field, _, value = line.partition(":")
        if field.strip().lower() == "version" and value.strip():
            return value.strip()
    return dist.version
