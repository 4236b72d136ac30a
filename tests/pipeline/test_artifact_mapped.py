"""Format /3 of the artifact: the weights in an aligned ``model.onnx.data`` member, mapped in place at load (a hard
link to the artifact in the module's private directory), their SHA-256 checked while the session is made; format /2
still read."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from onnx.external_data_helper import ExternalDataInfo
from torch import nn

import pipeline
from passes.model_io.external_data import ALIGNMENT, WEIGHTS_DIR_KEY, external_tensors, weights_dir
from pipeline.runtime import artifact_reading
from pipeline.runtime.artifact import DATA_MEMBER, FORMAT, INLINE_FORMAT, LINK_NAME
from pipeline.runtime.artifact_reading import read_artifact
from pipeline.runtime.mapped_zip import MappedZip
from pipeline.runtime.ort.executor import OnnxRuntimeExecutor


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


X = torch.randn(3, 32)


@pytest.fixture(scope="module")
def converted() -> pipeline.ConvertedModule:
    torch.manual_seed(0)
    return pipeline.convert(Mlp().eval(), torch.randn(3, 32), backend="onnxruntime", validate=False)


@pytest.fixture
def saved(converted: pipeline.ConvertedModule, tmp_path: Path) -> Path:
    return converted.save(tmp_path / "mlp.ptrt")


def ort_session(module: pipeline.ConvertedModule) -> Any:
    executor = module.executor
    assert isinstance(executor, OnnxRuntimeExecutor)
    return executor.session


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def write_zip(path: Path, contents: dict[str, bytes], fmt: str, *, compression: int = zipfile.ZIP_STORED) -> Path:
    """An artifact of ``contents`` with a manifest that matches them (a forger who knows the format)."""
    contents = {n: b for n, b in contents.items() if n != "manifest.json"}
    digests = {n: hashlib.sha256(b).hexdigest() for n, b in contents.items()}
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, blob in contents.items():
            archive.writestr(name, blob)
        archive.writestr("manifest.json", json.dumps({"format": fmt, "sha256": digests}))
    return path


def test_weights_are_one_aligned_member_and_the_graph_holds_none(saved: Path) -> None:
    contents = members(saved)
    assert json.loads(contents["manifest.json"])["format"] == FORMAT
    graph = onnx.load_model_from_string(contents["model.onnx"])
    assert weights_dir(graph) is None  # no path of this machine in the artifact
    tensors = list(external_tensors(graph))
    assert {t.name for t in tensors} >= {"up.weight", "down.weight"}  # every initializer of 1 KB or more
    assert all(len(t.raw_data) < 1024 for t in graph.graph.initializer)
    mapped = MappedZip(saved)
    try:
        start = mapped.data_offset(DATA_MEMBER)
    finally:
        mapped.close()
    assert start % ALIGNMENT == 0
    for tensor in tensors:  # each weight at an aligned offset of the file, so ONNX Runtime maps it in place
        info = ExternalDataInfo(tensor)
        assert info.location == DATA_MEMBER and (start + (info.offset or 0)) % ALIGNMENT == 0


def test_session_maps_the_artifact_and_the_module_reads_a_copy(
    converted: pipeline.ConvertedModule, saved: Path, tmp_path: Path
) -> None:
    loaded = pipeline.load(saved)
    torch.testing.assert_close(loaded(X), converted(X), rtol=0, atol=0)
    directory = weights_dir(loaded.onnx)
    assert directory is not None and (directory / LINK_NAME).samefile(saved)  # what the session maps
    # the module's graph reads its own copy of the weights member, a plain file that onnx's reader accepts too
    assert {ExternalDataInfo(t).location for t in external_tensors(loaded.onnx)} == {DATA_MEMBER}
    assert os.stat(directory / DATA_MEMBER).st_nlink == 1
    weight = next(t for t in external_tensors(loaded.onnx) if t.name == "up.weight")
    want = converted.onnx.graph.initializer
    inline = next(t for t in want if t.name == "up.weight")
    assert onnx.numpy_helper.to_array(weight, base_dir=str(directory)).tobytes() == inline.raw_data
    # the artifact replaced and removed under its name: the link keeps the file the module was loaded from
    converted.save(saved)
    saved.unlink()
    again = loaded.save(tmp_path / "again.ptrt")
    torch.testing.assert_close(pipeline.load(again)(X), converted(X), rtol=0, atol=0)
    files = loaded.save_onnx(tmp_path / "onnx" / "model.onnx")
    onnx.checker.check_model(str(files[0]), full_check=True)
    del loaded
    import gc

    gc.collect()
    assert not directory.exists()  # the private directory (and its link) goes with the module


def _directory_named_by(model: onnx.ModelProto) -> Path:
    """The weights directory the graph names, read without weights_dir (which writes the deferred copy)."""
    return Path(next(p.value for p in model.metadata_props if p.key == WEIGHTS_DIR_KEY))


def test_the_module_copy_of_the_weights_is_written_when_first_asked_for(
    converted: pipeline.ConvertedModule, saved: Path
) -> None:
    """A load writes no copy of the weights (the session maps the artifact); the module's graph gets its copy when
    its weights are first asked for, checked against the manifest."""
    loaded = pipeline.load(saved)
    torch.testing.assert_close(loaded(X), converted(X), rtol=0, atol=0)
    directory = _directory_named_by(loaded.onnx)
    assert sorted(os.listdir(directory)) == [LINK_NAME]
    assert weights_dir(loaded.onnx) == directory
    assert sorted(os.listdir(directory)) == [LINK_NAME, DATA_MEMBER]
    assert (directory / DATA_MEMBER).read_bytes() == members(saved)[DATA_MEMBER]
    assert os.stat(directory / DATA_MEMBER).st_nlink == 1


def test_the_deferred_copy_refuses_weights_written_over_in_place(saved: Path) -> None:
    loaded = pipeline.load(saved)
    mapped = MappedZip(saved)
    start = mapped.data_offset(DATA_MEMBER)
    mapped.close()
    with open(saved, "r+b") as artifact:  # the same file (the module's link), written over after the load
        artifact.seek(start + 8)
        artifact.write(b"\xff" * 8)
    for _ in range(2):  # refused each time asked, never a copy of other weights
        with pytest.raises(pipeline.ArtifactError, match="its weights changed since it was loaded"):
            weights_dir(loaded.onnx)
        assert not (_directory_named_by(loaded.onnx) / DATA_MEMBER).exists()


def test_loaded_module_prepacks_like_the_converted_one(saved: Path) -> None:
    session = ort_session(pipeline.load(saved))  # weights under external_data_threshold: prepacked, as before
    with pytest.raises(RuntimeError, match="does not have configuration"):  # the entry is not set at all
        session.get_session_options().get_session_config_entry("session.disable_prepacking")


def test_session_reads_the_copy_where_no_link_can_be_made(
    converted: pipeline.ConvertedModule, saved: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(artifact_reading.os, "link", refuse)
    with caplog.at_level(logging.INFO, logger="pipeline.runtime.artifact_reading"):
        loaded = pipeline.load(saved)
    assert "the session waits for the copy of its weights" in caplog.text  # said, not silent
    directory = weights_dir(loaded.onnx)
    assert directory is not None and (directory / DATA_MEMBER).is_file() and not (directory / LINK_NAME).exists()
    torch.testing.assert_close(loaded(X), converted(X), rtol=0, atol=0)


def test_format_2_with_inline_weights_still_loads(
    converted: pipeline.ConvertedModule, saved: Path, tmp_path: Path
) -> None:
    contents = members(saved)
    graph = onnx.load_model_from_string(contents.pop("model.onnx"))
    data = contents.pop(DATA_MEMBER)
    for tensor in external_tensors(graph):  # back inline, as format /2 kept small models
        info = ExternalDataInfo(tensor)
        offset = info.offset or 0
        tensor.raw_data = data[offset : offset + (info.length or 0)]
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    contents["model.onnx"] = graph.SerializeToString()
    old = write_zip(tmp_path / "old.ptrt", contents, INLINE_FORMAT)
    loaded = pipeline.load(old)
    assert not list(external_tensors(loaded.onnx)) and weights_dir(loaded.onnx) is None
    torch.testing.assert_close(loaded(X), converted(X), rtol=0, atol=0)


def test_corrupt_weights_fail_the_load_although_the_session_was_made(saved: Path, tmp_path: Path) -> None:
    contents = members(saved)
    data = bytearray(contents[DATA_MEMBER])
    data[5] ^= 0x01  # a weight a little off: ONNX Runtime takes it, the manifest does not
    manifest = contents["manifest.json"]
    contents[DATA_MEMBER] = bytes(data)
    forged = tmp_path / "forged.ptrt"
    with zipfile.ZipFile(forged, "w") as archive:
        for name, blob in contents.items():
            archive.writestr(name, manifest if name == "manifest.json" else blob)
    with pytest.raises(pipeline.ArtifactError, match=r"model\.onnx\.data does not match its SHA-256"):
        pipeline.load(forged)
    with pytest.raises(pipeline.ArtifactError, match=r"model\.onnx\.data does not match its SHA-256"):
        read_artifact(forged)
    pending = read_artifact(forged, wait=False)  # the check runs on; verified() says it, every time it is asked
    for _ in range(2):
        with pytest.raises(pipeline.ArtifactError, match="does not match"):
            pending.verified()


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_artifact(saved: Path, tmp_path: Path, cut: float) -> None:
    blob = saved.read_bytes()
    truncated = tmp_path / "cut.ptrt"
    truncated.write_bytes(blob[: int(len(blob) * cut)])
    with pytest.raises(pipeline.ArtifactError, match="corrupted or not an artifact"):
        pipeline.load(truncated)


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.ptrt").write_bytes(b"")
    with pytest.raises(pipeline.ArtifactError, match="corrupted or not an artifact"):
        pipeline.load(tmp_path / "empty.ptrt")


def test_compressed_members_are_refused(saved: Path, tmp_path: Path) -> None:
    forged = write_zip(tmp_path / "deflated.ptrt", members(saved), FORMAT, compression=zipfile.ZIP_DEFLATED)
    with pytest.raises(pipeline.ArtifactError, match="compressed"):
        pipeline.load(forged)


def test_tensor_pointing_outside_the_weights_member(saved: Path, tmp_path: Path) -> None:
    contents = members(saved)
    graph = onnx.load_model_from_string(contents["model.onnx"])
    tensor = next(external_tensors(graph))
    for entry in tensor.external_data:  # past the member: into the bytes of the members after it
        if entry.key == "offset":
            entry.value = str(len(contents[DATA_MEMBER]))
    contents["model.onnx"] = graph.SerializeToString()
    forged = write_zip(tmp_path / "outside.ptrt", contents, FORMAT)
    with pytest.raises(pipeline.ArtifactError, match=r"points outside model\.onnx\.data"):
        pipeline.load(forged)


def test_format_3_without_its_weights_member(saved: Path, tmp_path: Path) -> None:
    contents = members(saved)
    del contents[DATA_MEMBER]
    with pytest.raises(pipeline.ArtifactError, match=r"has no model\.onnx\.data"):
        pipeline.load(write_zip(tmp_path / "no-data.ptrt", contents, FORMAT))


def test_unknown_format(saved: Path, tmp_path: Path) -> None:
    forged = write_zip(tmp_path / "future.ptrt", members(saved), "torch-trt-pipeline-artifact/9")
    with pytest.raises(pipeline.ArtifactError, match="this version reads"):
        pipeline.load(forged)


def test_mapping_is_released_after_the_check(saved: Path) -> None:
    artifact = read_artifact(saved)  # waited: the hashing thread has closed the mapping and the file
    assert artifact.pending is not None
    fds = set(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else set()
    targets = {os.path.realpath(f"/proc/self/fd/{fd}") for fd in fds}
    assert str(saved.resolve()) not in targets


def test_prepacking_off_when_the_settings_say_so(tmp_path: Path) -> None:
    module = pipeline.convert(Mlp().eval(), X, backend="onnxruntime", validate=False, ort_prepack_weights=False)
    session = ort_session(pipeline.load(module.save(tmp_path / "m.ptrt")))  # the fastest load: mapped, not packed
    assert session.get_session_options().get_session_config_entry("session.disable_prepacking") == "1"
