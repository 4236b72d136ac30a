"""``pipeline --version``, ``-v`` after the command, ``pipeline inspect`` and ``pipeline bench`` on the example."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cnn")
    done = run_cli(
        "convert", "examples/cnn.py:build", "-o", str(out), "--dynamic", "x:0:batch:1:2:4", "-v"
    )  # -v after the command is taken
    assert done.returncode == 0, done.stderr
    return out / "model.ptrt"


def test_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("pipeline 0.")


def test_inspect_names_inputs_with_their_ranges_engine_and_accuracy(artifact: Path) -> None:
    done = run_cli("inspect", str(artifact))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "input     x: float32 [batch[1..4, opt 2], 3, 64, 64]" in lines
    assert any(line.startswith("output    out: float32 [batch, ") for line in lines)  # the user's name, not s31
    assert any(line.startswith("engine    none") for line in lines)
    assert any(line.startswith("accuracy  out: PASS") for line in lines)
    assert any(line.startswith("versions  ") and "onnxruntime" in line for line in lines)
    as_json = json.loads(run_cli("inspect", str(artifact), "--json").stdout)
    assert as_json["metadata"]["backend"] == "onnxruntime" and "model.onnx" in as_json["members"]


def test_inspect_of_a_directory_is_each_artifact_in_it(artifact: Path, tmp_path: Path) -> None:
    # a generation module saved as a directory (a recurrent model's step.ptrt and prompt.ptrt, a vision-language
    # model's graphs with its text step's directory inside)
    saved = tmp_path / "model.ptrt"
    (saved / "text").mkdir(parents=True)
    shutil.copy(artifact, saved / "step.ptrt")
    shutil.copy(artifact, saved / "text" / "prompt.ptrt")
    done = run_cli("inspect", str(saved))
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("==")] == [
        "== step.ptrt ==",
        "== text/prompt.ptrt ==",
    ]
    assert done.stdout.count("input     x: float32 [batch[1..4, opt 2], 3, 64, 64]") == 2
    as_json = json.loads(run_cli("inspect", str(saved), "--json").stdout)
    assert sorted(as_json) == ["step.ptrt", "text/prompt.ptrt"]
    assert as_json["step.ptrt"]["metadata"]["backend"] == "onnxruntime"
    empty = run_cli("inspect", str(saved / "text" / "missing"))
    assert empty.returncode == 1 and "no artifact at" in empty.stderr


def test_output_closed_by_its_reader_is_no_traceback(artifact: Path) -> None:
    # `pipeline inspect model.ptrt --json | head -2`: the reader closes the pipe before everything is written
    child = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "inspect", str(artifact), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 141 and b"Traceback" not in stderr, stderr.decode()


def test_inspect_of_a_file_that_is_not_an_artifact_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "x.ptrt"
    bogus.write_text("not a zip")
    done = run_cli("inspect", str(bogus))
    assert done.returncode == 1
    assert "is not a readable artifact" in done.stderr and "fix:" in done.stderr and "Traceback" not in done.stderr


def test_bench_times_converted_and_eager_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_cli("bench", "examples/cnn.py:build", "--warmup", "2", "--iterations", "5", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "converted (onnxruntime)" in done.stdout and "pytorch eager" in done.stdout
    figures = json.loads(out.read_text())
    for runner in ("converted", "pytorch"):
        r = figures[runner]
        assert r["iterations"] == 5 and 0 < r["median_ms"] <= r["p99_ms"] and r["throughput_per_s"] > 0
    assert figures["batch"] == 2 and figures["speedup_median"] > 0


def test_bench_of_an_artifact_needs_inputs_and_times_the_module(artifact: Path) -> None:
    done = run_cli("bench", str(artifact))
    assert done.returncode == 1 and "an artifact holds no sample" in done.stderr
    done = run_cli("bench", str(artifact), "--input", "x:3x3x64x64", "--iterations", "3", "--warmup", "1")
    assert done.returncode == 0, done.stderr
    assert "converted (onnxruntime)" in done.stdout and "pytorch eager" not in done.stdout
