"""The declared dependency floors hold: what is installed meets pyproject.toml, and a conversion works on it.

``.ci/run`` also runs this module in a second environment holding exactly the floors (``.ci/minimum-versions.txt``,
with ``PIPELINE_EXPECT_FLOORS=1``), so a floor that is too low fails CI instead of a user's install.
"""

from __future__ import annotations

import os
import re
from importlib.metadata import version
from pathlib import Path

import tomllib
import torch
from packaging.version import Version
from torch import nn

import pipeline

ROOT = Path(__file__).resolve().parent.parent


def declared_floors() -> dict[str, str]:
    """``{package: minimum}`` from pyproject.toml's dependencies."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {}
    for dep in deps:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", dep)
        assert match, f"dependency {dep!r} has no plain floor"
        floors[match[1]] = match[2]
    return floors


def test_installed_versions_meet_the_declared_floors() -> None:
    floors = declared_floors()
    for package, floor in floors.items():
        installed = Version(version(package).split("+")[0])
        assert installed >= Version(floor), f"{package} {installed} is below the declared floor {floor}"
    if os.environ.get("PIPELINE_EXPECT_FLOORS") == "1":  # the minimum-versions environment of .ci/run
        pinned = dict(
            line.split("==")
            for line in (ROOT / ".ci" / "minimum-versions.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")
        )
        for package, pin in pinned.items():
            assert Version(version(package)) == Version(pin), f"{package}: expected the floor {pin}"
            assert (
                Version(pin) == Version(floors[package])
                or package == "numpy"
                and Version(pin) >= Version(floors[package])
            ), f"{package}: .ci/minimum-versions.txt ({pin}) and pyproject.toml ({floors[package]}) disagree"


def test_conversion_in_fp32_and_fp16_with_dynamic_batch_and_artifact(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)).eval()
    x = torch.randn(2, 3, 8, 8)
    module = pipeline.convert(model, x, dynamic={"input": {0: ("batch", 1, 2, 4)}})
    assert module.report.accuracy is not None and module.report.accuracy.passed
    again = pipeline.load(module.save(tmp_path / "m.ptrt"))
    y = torch.randn(3, 3, 8, 8)
    torch.testing.assert_close(again(y), model(y), atol=1e-4, rtol=1e-3)
    half = pipeline.convert(model, x, precision="fp16")
    torch.testing.assert_close(half(x), model(x), atol=2e-2, rtol=2e-2)


def test_nvfp4_on_an_onnx_without_float4_is_refused_with_the_fix() -> None:
    """onnx before 1.18 has no FLOAT4E2M1: precision='nvfp4' is refused at once, naming the onnx to install (the
    minimum-versions environment's onnx 1.17 takes this path; newer onnx converts nvfp4 elsewhere in the suite)."""
    import onnx
    import pytest

    if hasattr(onnx.TensorProto, "FLOAT4E2M1"):
        pytest.skip(f"onnx {onnx.__version__} has FLOAT4E2M1 (the refusal is for onnx < 1.18)")
    with pytest.raises(pipeline.InputError, match=r"onnx>=1\.18"):
        pipeline.convert(nn.Linear(32, 32).eval(), torch.randn(2, 32), precision="nvfp4")
