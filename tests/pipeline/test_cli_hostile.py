"""The CLI on bad input: a clear error and exit code 1, no traceback, and nothing half-written in ``-o``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RAISING = """
import torch
def build():
    raise ValueError("no weights here")
"""

BROKEN = "def build(:\n    pass\n"

TINY = """
import torch
def build():
    return torch.nn.Linear(4, 3).eval(), torch.randn(2, 4)
"""


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


def assert_clear_error(done: subprocess.CompletedProcess[str], cause: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert cause in done.stderr and "fix:" in done.stderr, done.stderr


@pytest.fixture()
def specs(tmp_path: Path) -> Path:
    for name, text in (("raising.py", RAISING), ("broken.py", BROKEN), ("tiny.py", TINY)):
        (tmp_path / name).write_text(text)
    return tmp_path


def test_factory_that_raises(specs: Path) -> None:
    done = run_cli("convert", f"{specs}/raising.py:build", "-o", str(specs / "out"))
    assert_clear_error(done, "raised ValueError: no weights here")
    assert not (specs / "out").exists()


def test_spec_with_a_syntax_error(specs: Path) -> None:
    assert_clear_error(run_cli("convert", f"{specs}/broken.py:build", "-o", str(specs / "out")), "failed to import")


def test_negative_input_size(specs: Path) -> None:
    done = run_cli("convert", f"{specs}/tiny.py:build", "--input", "input:-1x4", "-o", str(specs / "out"))
    assert_clear_error(done, "sizes are whole numbers >= 1")


def test_output_that_is_a_file_is_refused_before_converting(specs: Path) -> None:
    target = specs / "taken"
    target.write_text("keep me")
    assert_clear_error(run_cli("convert", f"{specs}/tiny.py:build", "-o", str(target)), "is a file")
    assert target.read_text() == "keep me"


def test_output_holding_a_directory_where_a_file_goes_writes_nothing(specs: Path) -> None:
    out = specs / "out"
    (out / "model.onnx").mkdir(parents=True)
    done = run_cli("convert", f"{specs}/tiny.py:build", "-o", str(out))
    assert_clear_error(done, "holds a directory named model.onnx")
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]


def test_unwritable_output(specs: Path) -> None:
    assert_clear_error(run_cli("convert", f"{specs}/tiny.py:build", "-o", "/proc/pipeline-out"), "cannot write")


def test_failed_conversion_leaves_no_output(specs: Path) -> None:
    out = specs / "out"
    done = run_cli("convert", f"{specs}/tiny.py:build", "-o", str(out), "--tolerance", "nothing:1:1")
    assert_clear_error(done, "'nothing', which is neither an output")
    assert not out.exists()


def test_success_into_an_existing_directory_keeps_other_files(specs: Path) -> None:
    out = specs / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    done = run_cli("convert", f"{specs}/tiny.py:build", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "model.ptrt", "notes.txt", "report.json"]
