"""The engine cache's key and graph digest pinned down (``pipeline.backends.tensorrt.engine_cache``): the key of a fixed
graph, device and settings is a known value in every process and on every machine, whatever order the settings come
in, and the digest finds a model's external weights in the directory its metadata names. (The cache's entries, locks
and bound: test_engine_cache.py and test_engine_cache_bound.py.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from engine_cache_support import external_model

from converters.errors import BuildError
from passes.model_io.external_data import set_weights_dir
from pipeline.backends.tensorrt.engine_cache import CACHE_FORMAT, cache_key, graph_digest

GRAPH = "ab" * 32
DEVICE = {"tensorrt": "10.16.1.11", "compute_capability": "8.9"}
BUILD = {"trt_tf32": True, "dynamic": [[1, 4]], "trt_workspace_bytes": 1024}


def test_the_key_of_a_fixed_graph_device_and_settings_is_pinned() -> None:
    """A key computed differently (other field names, unsorted JSON) reads no entry an older version wrote: such a
    change must bump CACHE_FORMAT, and then this value."""
    assert CACHE_FORMAT == 1
    assert cache_key(GRAPH, DEVICE, BUILD) == "a1f526817aff0f7771d7bd45994a688d946e44434ab988c8404c434204cca68b"
    payload = {"build": BUILD, "device": DEVICE, "format": 1, "graph": GRAPH}
    assert cache_key(GRAPH, DEVICE, BUILD) == hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def test_the_key_does_not_depend_on_the_order_of_the_settings() -> None:
    reordered = dict(reversed(list(BUILD.items())))
    device = dict(reversed(list(DEVICE.items())))
    assert list(reordered) != list(BUILD) and cache_key(GRAPH, device, reordered) == cache_key(GRAPH, DEVICE, BUILD)
    assert cache_key(GRAPH, DEVICE, {**BUILD, "trt_tf32": False}) != cache_key(GRAPH, DEVICE, BUILD)


def test_the_digest_reads_the_weights_from_the_directory_the_model_names(tmp_path: Path) -> None:
    model = external_model(tmp_path)
    given = graph_digest(model, tmp_path)
    set_weights_dir(model, tmp_path)
    assert graph_digest(model) == given  # the directory is found in the metadata, and is not part of the digest
    set_weights_dir(model, tmp_path / "elsewhere")
    with pytest.raises(BuildError, match="cannot be read"):
        graph_digest(model)


def test_external_weights_without_a_directory_are_an_error_that_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as error:
        graph_digest(external_model(tmp_path))
    assert str(error.value) == (
        "[build] the graph keeps weights in the external file 'm.data' but no directory was given to find it\n"
        "  fix: pass the directory of the .onnx file (base_dir), or load the model with its external data"
    )
