"""Backend selection: TensorRT only when it imports and a CUDA device is present; never a silent fallback.

Where the shared TensorRT API tool is available (``../shared/tools/trt-api``; CI sets it up), the selection is
also checked with the real TensorRT 10.16 and 11.4 Python bindings importable, as on a user's machine that has
TensorRT but no usable GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: The shared trt-api tool: ``shared/tools/trt-api`` beside the repository (or beside the directory of worktrees).
SETUP = next(
    (
        p / "shared" / "tools" / "trt-api" / "setup.sh"
        for p in Path(__file__).resolve().parents[2:5]
        if (p / "shared" / "tools" / "trt-api" / "setup.sh").is_file()
    ),
    Path(__file__).resolve().parents[3] / "shared" / "tools" / "trt-api" / "setup.sh",
)
VERSIONS = ("11.4.0.106", "10.16.1.11")

SCRIPT = """
import sys, torch, pipeline
if sys.argv[1] == "block":
    sys.modules["tensorrt"] = None
from pipeline.runtime.executors import select_backend
choice = select_backend("auto")
print(choice.name)
print(choice.reason)
try:
    pipeline.convert(torch.nn.Linear(2, 2), torch.randn(2, 2), backend="tensorrt")
except pipeline.BuildError as exc:
    print("BuildError", str(exc).replace("\\n", " "))
"""


def run(mode: str, version: str | None = None) -> list[str]:
    command = [sys.executable, "-c", SCRIPT, mode]
    if version is not None:  # the real bindings, importable through the shared tool's environment
        command = ["bash", "-c", f'eval "$(bash {SETUP} --env {version})" && exec "$@"', "trt-api", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_auto_without_tensorrt_picks_onnxruntime_and_says_why() -> None:
    name, reason, error = run("block")
    assert name == "onnxruntime"
    assert reason.startswith("auto: TensorRT not usable") and "does not import" in reason
    assert error.startswith("BuildError [build] backend='tensorrt' was requested but TensorRT cannot run here")
    assert "backend='onnxruntime'" in error


def prepare_trt_api(version: str) -> None:
    if not SETUP.is_file():
        pytest.skip(f"the shared TensorRT API tool is not at {SETUP}")
    prepared = subprocess.run(
        ["bash", str(SETUP), version],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )
    if prepared.returncode != 0:
        pytest.skip(f"trt-api {version} could not be set up: {prepared.stderr[-300:]}")


@pytest.mark.parametrize("version", VERSIONS)
def test_real_tensorrt_api_without_gpu_is_not_picked(version: str) -> None:
    prepare_trt_api(version)
    name, reason, error = run("real", version)
    assert name == "onnxruntime"
    assert f"tensorrt {version} imports but no CUDA device is present" in reason
    assert "TensorRT cannot run here" in error and "torch.cuda.is_available()" in error


def test_bfloat16_output_on_onnxruntime_is_a_build_error_naming_it() -> None:
    import torch

    import pipeline
    from converters.errors import BuildError

    class ToBfloat16(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.bfloat16()

    with pytest.raises(BuildError, match=r"\['out'\] are bfloat16") as caught:
        pipeline.convert(ToBfloat16(), torch.randn(3, 4))
    assert "return float32" in str(caught.value)


def test_the_choice_is_logged_once_and_a_question_asked_of_it_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    """A conversion logs its backend choice at INFO once per graph it builds; a pass asking which backend the graph is
    lowered for (``quiet=True``) logs at DEBUG and issues no EngineNotRunnableWarning (a vision-language conversion
    printed the same long line five times)."""
    import logging
    import warnings

    from pipeline.runtime.executors import EngineNotRunnableWarning, select_backend
    from pipeline.settings import Settings

    with caplog.at_level(logging.DEBUG, logger="pipeline.runtime.executors"):
        loud, quiet = select_backend("onnxruntime"), select_backend("onnxruntime", quiet=True)
    assert loud == quiet
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "backend: onnxruntime (requested (backend='onnxruntime'))"),
        (logging.DEBUG, "backend: onnxruntime (requested (backend='onnxruntime'))"),
    ]
    pytest.importorskip("tensorrt_rtx")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        select_backend("tensorrt-rtx", Settings(backend="tensorrt-rtx"), quiet=True)
        assert not caught
        select_backend("tensorrt-rtx", Settings(backend="tensorrt-rtx"))
    assert [w.category for w in caught] == [EngineNotRunnableWarning]
