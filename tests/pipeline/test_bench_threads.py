"""``pipeline bench`` compares like with like: the same thread count on both sides, ONNX Runtime's threads not
spinning between calls, timing interleaved, and the JSON says which settings were used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline.cli.bench import time_interleaved
from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

ROOT = Path(__file__).resolve().parents[2]
SPINNING = "session.intra_op.allow_spinning"


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    fast = ("--warmup", "1", "--iterations", "4")
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "bench", "examples/cnn.py:build", *fast, *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )


def test_bench_uses_equal_threads_without_spinning_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_bench("--threads", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr
    threads = json.loads(out.read_text())["threads"]
    assert threads["torch_intra_op"] == threads["onnxruntime_intra_op"] == threads["requested"] == 1
    assert threads["onnxruntime_allow_spinning"] is False
    assert threads["timing"].startswith("interleaved") and threads["cpu_count"] >= 1
    assert "threads: torch 1, onnxruntime intra-op 1 (spinning off)" in done.stdout


def test_bench_spinning_back_on_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_bench("--threads", "2", "--ort-spinning", "--json", str(out))
    assert done.returncode == 0, done.stderr
    threads = json.loads(out.read_text())["threads"]
    assert threads["torch_intra_op"] == threads["onnxruntime_intra_op"] == 2
    assert threads["onnxruntime_allow_spinning"] is True


def test_bench_refuses_a_thread_count_that_is_not_one() -> None:
    done = run_bench("--threads", "0")
    assert done.returncode == 1 and "--threads 0" in done.stderr and "fix:" in done.stderr


def test_the_settings_reach_the_onnxruntime_session() -> None:
    """The session the converted module runs is made with the thread count and the spinning entry asked for."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    module = pipeline.convert(model, torch.randn(2, 4), backend="onnxruntime", validate=False)
    for spinning, entry in ((False, "0"), (True, "1")):
        settings = pipeline.Settings(ort_intra_op_threads=1, ort_allow_spinning=spinning)
        session = OnnxRuntimeExecutor(module.onnx, module.io, settings).session
        options = session.get_session_options()
        assert options.intra_op_num_threads == 1 and options.get_session_config_entry(SPINNING) == entry
    default = OnnxRuntimeExecutor(module.onnx, module.io, pipeline.Settings()).session.get_session_options()
    with pytest.raises(RuntimeError, match="does not have configuration"):  # None: ONNX Runtime's own default
        default.get_session_config_entry(SPINNING)


def test_interleaved_timing_alternates_the_order() -> None:
    order: list[str] = []
    times = time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 1, 4)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up, then alternating rounds
    assert [len(t) for t in times.values()] == [4, 4]
