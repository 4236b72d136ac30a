"""The README stays true: CI runs its quick-start test line verbatim, and its examples, run as a user runs them (a
fresh interpreter; the harness of tests/docs_support.py, as for the documentation site), pass and print no
third-party warning to stderr."""

from __future__ import annotations

import re
from pathlib import Path

from docs_support import ROOT, make_workdir, problems, run_page, third_party_lines


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
    ci = (ROOT / ".ci" / "run").read_text()
    assert install_and_test in ci.splitlines()
    assert install_and_run in ci  # in a copy of the tree, beside the tests: a plain install's newest releases


def test_constraints_pin_torch_for_our_installs_only() -> None:
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().splitlines()
    assert '"torch>=2.6"' in (ROOT / "pyproject.toml").read_text()


#: What a user checks after running the README's examples, in the namespace of its Python blocks.
CHECK = (
    "import torch\n"
    "assert y.shape == (5, 4)\n"
    "torch.testing.assert_close(again(torch.ones(3, 3, 32, 32)), module(torch.ones(3, 3, 32, 32)))\n"
    "assert [str(k) for k in registry.op_keys()][-1] == 'mylib::shifted_relu'\n"
    "assert 'Div' not in [n.op_type for n in rewritten.onnx.graph.node]\n"
    "assert report.first_divergence.layer.module == '1'\n"
)


def test_readme_examples_run(tmp_path: Path) -> None:
    """Every example of the README, as a user runs it: its Python blocks in one fresh interpreter, then its
    commands, none printing a third-party warning."""
    assert problems("README.md") == []
    runs = run_page("README.md", make_workdir(tmp_path), CHECK)
    assert len(runs) >= 3
    for run in runs:
        assert run.returncode == 0, f"{run.what}\n{run.stderr[-4000:]}"
        assert third_party_lines(run.stderr, ("engine built for",)) == [], f"{run.what}\n{run.stderr}"


def test_readme_is_short_and_links_every_guide() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for guide in sorted((ROOT / "docs" / "guides").glob("*.md")):
        assert f"docs/guides/{guide.name}" in text, guide.name


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


def test_what_is_verified_without_a_gpu_agrees_with_the_tensorrt_rtx_section() -> None:
    """The README's summary and the full page say the same: TensorRT-RTX parses and builds here, NVIDIA TensorRT does
    not, and no engine runs."""
    readme = (ROOT / "README.md").read_text()
    page = (ROOT / "docs" / "verified.md").read_text()
    sections = [readme.split("## What is verified without a GPU, and what is not\n", 1)[1].split("\n## ", 1)[0], page]
    for section in sections:
        section = " ".join(section.split())  # prose, whatever its line breaks
        verified, _, not_verified = section.partition("**Not verified")
        assert "has a GPU or TensorRT" not in section  # TensorRT-RTX is installed: "no TensorRT" is not true here
        assert "TensorRT-RTX's real ONNX parser and builder" in verified
        assert "parsing and building" not in not_verified  # TensorRT-RTX parses and builds here: not unqualified
        assert "NVIDIA TensorRT's own parser and builder" in not_verified
        assert "running any engine" in not_verified
