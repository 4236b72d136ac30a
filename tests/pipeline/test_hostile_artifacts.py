"""Artifacts that cannot lie, loads that cannot crash, an engine cache that degrades: hostile inputs, each a clear
library error (class, cause, fix) or a correct result with a warning."""

from __future__ import annotations

import hashlib
import json
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import pipeline
from pipeline.runtime.artifact_reading import ArtifactVersionWarning


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    module = pipeline.convert(
        nn.Linear(4, 3).eval(), torch.randn(2, 4), backend="onnxruntime", dynamic={"input": {-2: ("b", 1, 4, 8)}}
    )
    return module.save(tmp_path_factory.mktemp("a") / "m.ptrt")


def rewrite(source: Path, target: Path, edit: Callable[[dict[str, bytes]], None], *, reseal: bool) -> Path:
    """A copy of the artifact with ``edit`` applied to its members; ``reseal`` rewrites the manifest to match
    (a forger who knows the format), so the checks behind the hashes are reached too."""
    with zipfile.ZipFile(source) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    edit(members)
    if reseal:
        digests = {n: hashlib.sha256(b).hexdigest() for n, b in members.items() if n != "manifest.json"}
        members["manifest.json"] = json.dumps({"format": "torch-trt-pipeline-artifact/2", "sha256": digests}).encode()
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return target


def edit_metadata(change: Callable[[dict], object]) -> Callable[[dict[str, bytes]], None]:
    def edit(members: dict[str, bytes]) -> None:
        metadata = json.loads(members["metadata.json"])
        result = change(metadata)  # a list replaces the metadata; anything else (None, a popped value) edits it
        members["metadata.json"] = json.dumps(result if isinstance(result, list) else metadata).encode()

    return edit


def expect_artifact_error(path: Path, cause: str) -> None:
    with pytest.raises(pipeline.ArtifactError) as info:
        pipeline.load(path)
    text = str(info.value)
    assert cause in text and "fix:" in text, text


def test_negative_dynamic_axis_is_normalised_and_enforced_after_loading(saved: Path) -> None:
    loaded = pipeline.load(saved)
    assert [(d.axis, d.min, d.max) for d in loaded.settings.dynamic] == [(0, 1, 8)]
    loaded(torch.randn(8, 4))
    with pytest.raises(pipeline.InputError, match="outside the declared range"):
        loaded(torch.randn(100, 4))


def test_edited_metadata_is_caught_by_the_manifest(saved: Path, tmp_path: Path) -> None:
    forged = rewrite(saved, tmp_path / "f.ptrt", edit_metadata(lambda m: m.update(backend="tensorrt")), reseal=False)
    expect_artifact_error(forged, "member metadata.json does not match its SHA-256")


def test_member_added_after_saving(saved: Path, tmp_path: Path) -> None:
    forged = rewrite(saved, tmp_path / "f.ptrt", lambda m: m.update({"engine.plan": b"x"}), reseal=False)
    expect_artifact_error(forged, "member engine.plan is not covered by the manifest")


def test_member_the_manifest_lists_but_the_artifact_lacks(saved: Path, tmp_path: Path) -> None:
    def drop_graph(members: dict[str, bytes]) -> None:
        del members["model.onnx"]

    forged = rewrite(saved, tmp_path / "f.ptrt", drop_graph, reseal=False)
    expect_artifact_error(forged, "the manifest lists model.onnx, which the artifact lacks")


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        (lambda m: [1, 2], "metadata.json is not a JSON object"),
        (lambda m: m.pop("io"), "lacks 'io'"),
        (lambda m: m.update(settings="fast"), "lacks 'settings' (or it is not a dict)"),
        (lambda m: m["io"]["inputs"][0].__setitem__(0, "renamed"), "do not match the graph's"),
        (lambda m: m["io"]["inputs"][0].__setitem__(1, "int64"), "do not match the graph's"),
        (lambda m: m["io"]["outputs"].append(["extra", "float32", [1]]), "do not match the graph's"),
        (lambda m: m["io"].pop("output_tree"), "I/O spec in metadata.json is malformed"),
        (lambda m: m["io"]["inputs"][0][2].__setitem__(1, 5), "input 'input' axis 1 is 5 in metadata.json, 4 in"),
        (lambda m: m["io"]["inputs"][0][2].__setitem__(1, "d"), "input 'input' axis 1 is 'd' in metadata.json, 4 in"),
        (
            lambda m: m["settings"]["dynamic"].append({**m["settings"]["dynamic"][0], "axis": 1, "name": "d"}),
            "dynamic dimension 'd' (input 'input' axis 1) in metadata.json, but the graph fixes that axis at 4",
        ),
        (
            lambda m: m["settings"]["dynamic"][0].update(min=9),
            "the settings in metadata.json are not valid: dynamic dimension 'b'",
        ),
    ],
    ids=[
        "not-object",
        "no-io",
        "settings-not-object",
        "input-renamed",
        "input-dtype",
        "extra-output",
        "no-tree",
        "input-fixed-size",
        "input-fixed-made-dynamic",
        "settings-dynamic-on-fixed-axis",
        "settings-min-above-max",
    ],
)
def test_resealed_metadata_that_lies_is_rejected(saved: Path, tmp_path: Path, change: Callable, cause: str) -> None:
    expect_artifact_error(rewrite(saved, tmp_path / "f.ptrt", edit_metadata(change), reseal=True), cause)


def test_other_library_versions_load_with_a_warning(saved: Path, tmp_path: Path) -> None:
    older = rewrite(
        saved, tmp_path / "old.ptrt", edit_metadata(lambda m: m["versions"].update(onnxruntime="1.18.0")), reseal=True
    )
    with pytest.warns(ArtifactVersionWarning, match=r"onnxruntime 1\.18\.0 \(here "):
        loaded = pipeline.load(older)
    x = torch.randn(3, 4)
    torch.testing.assert_close(loaded(x), pipeline.load(saved)(x))


def test_unchanged_artifact_loads_without_a_warning(saved: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArtifactVersionWarning)
        pipeline.load(saved)


@pytest.mark.parametrize("bad", [123, None, b"m.ptrt"], ids=["int", "none", "bytes"])
def test_load_of_something_that_is_not_a_path(bad: object) -> None:
    with pytest.raises(pipeline.ArtifactError, match="pass the path of a .ptrt file"):
        pipeline.load(bad)  # type: ignore[arg-type]


def test_load_of_a_directory(tmp_path: Path) -> None:
    expect_artifact_error(tmp_path, "no artifact at")


def test_engine_cache_that_is_a_file_degrades_to_no_cache_with_a_warning(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is in the dev extra (pip install tensorrt-rtx)")
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    with pytest.warns(UserWarning, match="engine cache in .* cannot be used"):
        module = pipeline.convert(
            nn.Linear(4, 3).eval(), torch.randn(2, 4), backend="tensorrt-rtx", cache_dir=str(blocker), validate=False
        )
    assert module.engine_bytes and blocker.read_text() == "not a directory"


def test_a_report_that_does_not_read_is_an_artifact_error_when_asked_for(saved: Path, tmp_path: Path) -> None:
    """The report is read when first asked for (a load does not import its classes): a record that does not read
    is then an ArtifactError, not a KeyError (nor, through nn.Module, a missing attribute); the module still runs."""
    from converters.errors import ArtifactError

    lying = rewrite(saved, tmp_path / "r.ptrt", edit_metadata(lambda m: m.update(report={"graph": 3})), reseal=True)
    loaded = pipeline.load(lying)
    x = torch.randn(3, 4)
    torch.testing.assert_close(loaded(x), pipeline.load(saved)(x))
    with pytest.raises(ArtifactError, match="conversion report does not read"):
        loaded.report  # noqa: B018 -- the property is what is tested
