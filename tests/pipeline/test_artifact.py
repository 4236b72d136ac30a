"""save/load round trip: one file, atomically written, same outputs after loading in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import pipeline


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.GELU())
        self.a = nn.Linear(16, 2)
        self.b = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> dict[str, torch.Tensor]:
        h = self.body(x) * scale
        return {"a": self.a(h), "b": self.b(h).softmax(-1)}


@pytest.fixture(scope="module")
def converted() -> pipeline.ConvertedModule:
    return pipeline.convert(
        TwoHeads().eval(),
        ((torch.randn(4, 6),), {"scale": 0.5}),
        backend="onnxruntime",
        dynamic={"x": {0: ("batch", 1, 4, 32)}},
    )


def test_round_trip_same_outputs_structure_and_report(converted: pipeline.ConvertedModule, tmp_path: Path) -> None:
    path = converted.save(tmp_path / "two_heads.ptrt")
    loaded = pipeline.load(path)
    x = torch.randn(9, 6)
    want = converted(x, scale=0.5)
    got = loaded(x, scale=0.5)
    assert set(got) == {"a", "b"}
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
    assert loaded.report.to_dict() == converted.report.to_dict()
    assert loaded.settings.dynamic == converted.settings.dynamic
    assert loaded.backend == "onnxruntime"


def test_artifact_holds_graph_metadata_and_hashes(converted: pipeline.ConvertedModule, tmp_path: Path) -> None:
    path = converted.save(tmp_path / "m.ptrt")
    with zipfile.ZipFile(path) as archive:
        # no engine (ORT backend); the weights member always (format /3), empty when every tensor is small
        assert set(archive.namelist()) == {"model.onnx", "model.onnx.data", "metadata.json", "manifest.json"}
        metadata = json.loads(archive.read("metadata.json"))
        manifest = json.loads(archive.read("manifest.json"))
    assert metadata["versions"]["torch"].startswith("2.")
    assert set(manifest["sha256"]) == {"model.onnx", "model.onnx.data", "metadata.json"}  # the metadata too
    assert [i[0] for i in metadata["io"]["inputs"]] == ["x"]
    assert metadata["io"]["inputs"][0][2] == ["batch", 6]
    assert metadata["settings"]["dynamic"][0]["name"] == "batch"


def test_save_is_atomic_and_leaves_no_temporary_files(converted: pipeline.ConvertedModule, tmp_path: Path) -> None:
    path = converted.save(tmp_path / "m.ptrt")
    before = path.read_bytes()
    converted.save(path)  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ptrt"]
    assert zipfile.ZipFile(path).testzip() is None
    assert len(path.read_bytes()) == len(before)


def test_constant_argument_is_enforced_after_loading(converted: pipeline.ConvertedModule, tmp_path: Path) -> None:
    loaded = pipeline.load(converted.save(tmp_path / "m.ptrt"))
    with pytest.raises(pipeline.InputError, match=r"(?s)exported with 0.5.*built in"):
        loaded(torch.randn(2, 6), scale=2.0)


def test_load_in_a_fresh_process(converted: pipeline.ConvertedModule, tmp_path: Path) -> None:
    path = converted.save(tmp_path / "m.ptrt")
    x = torch.randn(3, 6)
    torch.save({"x": x, "a": converted(x, scale=0.5)["a"]}, tmp_path / "io.pt")
    script = (
        "import sys, torch, pipeline\n"
        f"data = torch.load({str(tmp_path / 'io.pt')!r})\n"
        f"m = pipeline.load({str(path)!r})\n"
        "torch.testing.assert_close(m(data['x'], scale=0.5)['a'], data['a'], rtol=0, atol=0)\n"
        "print('ok', m.backend)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok onnxruntime"


def test_tensorrt_artifact_on_a_machine_without_tensorrt(converted: pipeline.ConvertedModule, tmp_path: Path) -> None:
    path = converted.save(tmp_path / "m.ptrt")
    with pytest.raises(pipeline.BuildError, match=r"(?s)TensorRT cannot run here.*backend='onnxruntime'"):
        pipeline.load(path, backend="tensorrt")
