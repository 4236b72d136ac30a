"""The library versions an artifact records (``pipeline.versions``), read from each distribution's ``Version``
header, are importlib.metadata's: an artifact written here and loaded here warns of no other version."""

from __future__ import annotations

import importlib.metadata

import pytest

from pipeline.versions import LIBRARIES, distribution_version, library_versions


@pytest.mark.parametrize("name", [*LIBRARIES, "torch-trt-pipeline", "numpy", "transformers"])
def test_the_version_read_is_importlib_metadatas(name: str) -> None:
    try:
        expected = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            distribution_version(name)
        return
    assert distribution_version(name) == expected


def test_library_versions_name_what_is_installed_and_hand_out_copies() -> None:
    versions = library_versions()
    assert versions["torch"] == importlib.metadata.version("torch") and "onnxruntime" in versions
    versions["torch"] = "edited"
    assert library_versions()["torch"] != "edited"
