"""The CLI on the bundled example, as the README's quick start runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

import pipeline

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


def test_convert_bundled_example(tmp_path: Path) -> None:
    done = run_cli("convert", "examples/cnn.py:build", "-o", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "accuracy  PASS" in done.stdout
    assert "backend   onnxruntime" in done.stdout
    assert f"artifact  {tmp_path / 'model.ptrt'}  (graphs: {tmp_path / 'model.onnx'}; report: " in done.stdout
    for stage in ("export", "passes", "check", "build", "validate"):  # progress per stage, on stderr
        assert f"{stage} done in" in done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["accuracy"]["outputs"][0]["passed"] is True
    module = pipeline.load(tmp_path / "model.ptrt")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import cnn
    finally:
        sys.path.pop(0)
    model, sample = cnn.build()
    with torch.no_grad():
        torch.testing.assert_close(module(sample), model(sample), rtol=1e-4, atol=1e-5)


def test_convert_with_inputs_and_dynamic(tmp_path: Path) -> None:
    done = run_cli(
        "convert",
        "torch.nn:Identity",
        "--input",
        "input:3x5:float32",
        "--dynamic",
        "input:0:batch:1:3:8",
        "-o",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    module = pipeline.load(tmp_path / "model.ptrt")
    x = torch.randn(7, 5)
    torch.testing.assert_close(module(x), x)


def test_bad_spec_is_a_clear_error(tmp_path: Path) -> None:
    done = run_cli("convert", "examples/cnn.py:nope", "-o", str(tmp_path))
    assert done.returncode == 1
    assert "has no callable 'nope'" in done.stderr and "fix:" in done.stderr
    assert not any(tmp_path.iterdir())


def test_module_without_sample_needs_inputs(tmp_path: Path) -> None:
    done = run_cli("convert", "torch.nn:ReLU", "-o", str(tmp_path))
    assert done.returncode == 1
    assert "--input NAME:SHAPE" in done.stderr
