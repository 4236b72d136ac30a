"""The README's quick start stays true: CI runs its test line verbatim, and its API example runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quick_start_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the Quick start section has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one() -> None:
    install_and_run, install_and_test = quick_start_lines()[:2]
    assert "pipeline convert examples/cnn.py:build" in install_and_run
    assert "-c constraints.txt" in install_and_run and "-c constraints.txt" in install_and_test
    assert "pytest" in install_and_test
    assert install_and_test in (ROOT / ".ci" / "run").read_text().splitlines()


def test_constraints_pin_torch_for_our_installs_only() -> None:
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().splitlines()
    assert '"torch>=2.6"' in (ROOT / "pyproject.toml").read_text()


def test_python_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    text = (ROOT / "README.md").read_text()
    section = text.split("## Python API", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)
    assert scope["y"].shape == (5, 4)  # type: ignore[attr-defined]
    x = torch.ones(3, 3, 32, 32)
    torch.testing.assert_close(scope["again"](x), scope["module"](x))  # type: ignore[operator]
    assert (tmp_path / "model.ptrt").is_file()


def test_writing_a_converter_examples_run() -> None:
    """The user's custom op and its converter, written only from the README, match PyTorch to 1e-5."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Writing a converter", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    scope: dict[str, object] = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    exec(compile(blocks[1], "README.md", "exec"), scope)  # the GeLU override registers on the same registry
    registry = scope["registry"]
    assert [str(k) for k in registry.op_keys()][-2:] == ["mylib::shifted_relu", "Gelu"]  # type: ignore[attr-defined]


def test_pattern_rewrite_example_runs() -> None:
    import torch

    text = (ROOT / "README.md").read_text()
    section = text.split("## Graph passes and the TensorRT parser check", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()

    class Halve(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return model(x) / 2.0

    scope: dict[str, object] = {"pipeline": __import__("pipeline"), "model": Halve(), "sample": torch.randn(2, 4)}
    exec(compile(block, "README.md", "exec"), scope)
    ops = [n.op_type for n in scope["module"].onnx.graph.node]  # type: ignore[attr-defined]
    assert "Div" not in ops and "Mul" in ops
