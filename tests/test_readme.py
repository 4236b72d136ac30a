"""The README stays true: CI runs its quick-start test line verbatim, its examples run, and each of its Python and
command-line examples, run as a user runs it (a fresh interpreter), prints no third-party warning to stderr."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
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


# -- every example as a user runs it: a fresh interpreter, stderr captured ------------------------------------------

#: Python examples, by section and block index (the "Graph passes" block 0 uses a user's own MyPass; block 1 needs a
#: model and a sample, given by PRELUDES). The converter section's blocks run together, in one interpreter.
PYTHON_EXAMPLES: dict[str, tuple[str, tuple[int, ...]]] = {
    "python-api": ("Python API", (0,)),
    "writing-a-converter": ("Writing a converter", (0, 1)),
    "rewrite-rule": ("Graph passes and the TensorRT parser check", (1,)),
    "compare": ("Comparing with PyTorch", (0,)),
    "precision": ("Precision (fp16, bf16)", (0,)),
    "quantization": ("Quantization (INT8, FP8)", (0,)),
    "four-bit": ("4-bit weights (INT4, NVFP4)", (0,)),
    "plugins": ("Plugins", (0,)),
    "engine-options": ("Engine options", (1,)),  # block 0 needs TensorRT and a GPU
}
PRELUDES = {
    "rewrite-rule": "import torch\nimport pipeline\n"
    "model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()\nsample = torch.randn(2, 4)\n",
}
#: Our own warnings that an example is expected to print (the first words of the message).
EXPECTED_WARNINGS: dict[str, tuple[str, ...]] = {}


def section_blocks(title: str, language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def cli_examples() -> list[str]:
    """The command lines of the README's "Command line" block that run on files the repository has."""
    lines = section_blocks("Command line", "bash")[0].replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in lines if line.strip() and "my_models.py" not in line]


#: Python examples run with log records named (the format is the only change to a user's run): "log NAME: message".
NAMED_LOGS = "import logging\nlogging.basicConfig(format='log %(name)s: %(message)s')\n"
OURS = r"(pipeline|passes|converters)"


def third_party_lines(stderr: str, expected: tuple[str, ...] = ()) -> list[str]:
    """The lines of ``stderr`` a default run should not print: anything from a third party (another library's log
    record, a Python warning raised outside our packages, a raw print) and our own warnings that the example does not
    expect (``expected``: their first words). Always allowed: the CLI's stage lines (two spaces, then a message of
    our loggers: no other logger has that handler)."""
    own_log = re.compile(rf"^log {OURS}(\.\w+)*: (.*)")
    own_warning = re.compile(rf"/{OURS}/[\w/]+\.py:\d+: \w*Warning: (.*)")
    lines = stderr.splitlines()
    foreign = []
    for index, line in enumerate(lines):
        previous = lines[index - 1] if index else ""
        message = next(
            (m.group(m.lastindex or 0) for m in (own_log.match(line), own_warning.search(line)) if m),
            line[len("warning: ") :] if line.startswith("warning: ") else None,
        )
        if message is not None:  # ours, or a Python warning as the CLI prints it: say-so needed
            if not any(message.startswith(e) for e in expected):
                foreign.append(line)
        elif own_warning.search(previous) and line.startswith("  "):
            continue  # the source line Python prints under our warning
        elif not re.match(r"^  \S", line) or re.match(r"^  (TensorRT|Polygraphy|onnxscript|torch)\b", line):
            foreign.append(line)
    return foreign


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the repository's examples/, as a user's checkout does (outputs land in its out/)."""
    directory = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "examples", directory / "examples")
    return directory


@pytest.mark.parametrize("name", list(PYTHON_EXAMPLES))
def test_python_examples_print_no_third_party_warnings(name: str, workdir: Path) -> None:
    title, indices = PYTHON_EXAMPLES[name]
    blocks = section_blocks(title, "python")
    source = NAMED_LOGS + PRELUDES.get(name, "") + "\n".join(blocks[i] for i in indices)
    run = subprocess.run(
        [sys.executable, "-c", source], cwd=workdir, capture_output=True, text=True, timeout=900, env=_env()
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert third_party_lines(run.stderr, EXPECTED_WARNINGS.get(name, ())) == [], run.stderr


@pytest.mark.parametrize("command", cli_examples())
def test_cli_examples_print_no_third_party_warnings(command: str, workdir: Path) -> None:
    words = shlex.split(command)
    executable = [sys.executable, "-m", "pipeline"] if words[0] == "pipeline" else [sys.executable]
    words = words[1:] if words[0] == "pipeline" else words[1:]
    run = subprocess.run([*executable, *words], cwd=workdir, capture_output=True, text=True, timeout=900, env=_env())
    assert run.returncode == 0, run.stderr[-4000:]
    assert third_party_lines(run.stderr) == [], run.stderr


def test_the_stderr_check_catches_third_party_noise() -> None:
    """The check itself: onnxscript's reshape message, a torch warning, a TensorRT line and our own unexpected
    notice are caught; the CLI's stage lines and an expected warning are not."""
    stderr = "\n".join(
        [
            "  export ...",
            "  export done in 1.20 s",
            "warning: precision fp16: only 12% of MatMul FLOPs in float16",
            "Evaluation failed: cannot reshape array of size 4 into shape (2,3)",
            "log onnxscript.optimizer._constant_folding: Evaluation failed: cannot reshape array",
            "/x/site-packages/torch/onnx/_internal/exporter/_core.py:12: UserWarning: something",
            "  warnings.warn(",
            "  TensorRT-RTX: ModelImporter.cpp:1071: Make sure input input_ids has Int64 binding.",
            "log pipeline.exporting.stage: the model is in training mode; converting it in eval mode",
            "/x/pipeline/conversion.py:40: UserWarning: the sample requires grad",
            "  warnings.warn(",
        ]
    )
    assert third_party_lines(stderr, ("precision fp16", "the sample requires grad")) == [
        "Evaluation failed: cannot reshape array of size 4 into shape (2,3)",
        "log onnxscript.optimizer._constant_folding: Evaluation failed: cannot reshape array",
        "/x/site-packages/torch/onnx/_internal/exporter/_core.py:12: UserWarning: something",
        "  TensorRT-RTX: ModelImporter.cpp:1071: Make sure input input_ids has Int64 binding.",
        "log pipeline.exporting.stage: the model is in training mode; converting it in eval mode",
    ]


def _env() -> dict[str, str]:
    """The user's environment, minus what would make the run unlike a user's (pytest's warning filters)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.pop("PYTHONWARNINGS", None)
    return env


def test_what_is_verified_without_a_gpu_agrees_with_the_tensorrt_rtx_section() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## What is verified without a GPU, and what is not\n", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())  # prose, whatever its line breaks
    verified, _, not_verified = section.partition("**Not verified")
    assert "has a GPU or TensorRT" not in section  # TensorRT-RTX is installed: "no TensorRT" is not true here
    assert "TensorRT-RTX's real ONNX parser and builder" in verified
    assert "parsing and building" not in not_verified  # TensorRT-RTX parses and builds here: not unqualified
    assert "NVIDIA TensorRT's own parser and builder" in not_verified
