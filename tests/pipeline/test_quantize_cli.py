"""``pipeline convert --precision int8|fp8 --calibration ...`` on the bundled example."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


def test_convert_int8_with_calibration_file(tmp_path: Path) -> None:
    samples = tmp_path / "calibration.pt"
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import cnn
    finally:
        sys.path.pop(0)
    _, sample = cnn.build()
    torch.save([torch.randn_like(sample) for _ in range(4)], samples)
    out = tmp_path / "out"
    done = run_cli(
        "convert",
        "examples/cnn.py:build",
        "-o",
        str(out),
        "--precision",
        "int8",
        "--calibration",
        str(samples),
        "--calibration-method",
        "percentile",
        "--quantize-fallback",
        "fp32",
    )
    assert done.returncode == 0, done.stderr
    assert "quantize  int8" in done.stdout and "calibration percentile on 4 inputs" in done.stdout
    assert "unquantized ops in fp32" in done.stdout and "requantizes the float outputs of 3 convolutions" in done.stdout
    report = json.loads((out / "report.json").read_text())["quantization"]
    assert report["precision"] == "int8" and report["quantized"] and report["fallback"] == "fp32"
    assert all(op["activation_scale"] > 0 for op in report["quantized"])
    assert len(report["ort_conv_output_ranges"]) == 3


def test_calibration_that_is_not_a_list_is_a_clear_error(tmp_path: Path) -> None:
    samples = tmp_path / "one.pt"
    torch.save(torch.randn(2, 3), samples)
    done = run_cli(
        "convert", "examples/cnn.py:build", "-o", str(tmp_path), "--precision", "fp8", "--calibration", str(samples)
    )
    assert done.returncode != 0
    assert "not a list of samples" in done.stderr and "fix:" in done.stderr


def test_exact_convolution_outputs_and_the_fp16_fallback_warning_name_the_cli_flags(tmp_path: Path) -> None:
    done = run_cli(
        "convert", "examples/cnn.py:build", "-o", str(tmp_path / "out"), "--precision", "int8",
        "--ort-int8-conv-outputs", "exact", "--no-validate",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "requantizes" not in done.stdout  # exact: the session keeps TensorRT's float convolution outputs
    assert "--quantize-fallback fp32" in done.stdout + done.stderr  # the default fp16 fallback on the CPU: loud
