"""The documentation site stays true: ``mkdocs build --strict`` succeeds (broken links, missing pages and API
references that do not resolve fail it), and every example on every page runs as a user runs it (a fresh interpreter
per page, its commands in a shell), printing no third-party warning to stderr. The harness: tests/docs_support.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_support import ROOT, blocks, commands, make_workdir, problems, python_source, run_page, third_party_lines

PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
RUNNABLE = [
    p
    for p in PAGES
    if python_source(p) is not None or any(b.language in ("bash", "console") and b.skip is None for b in blocks(p))
]

#: What a user checks after running a page's examples, run in the namespace of its Python blocks.
CHECKS = {
    "docs/getting-started.md": (
        "import torch\nfrom pathlib import Path\n"
        "assert y.shape == (5, 4)\n"
        "x = torch.ones(3, 3, 32, 32)\n"
        "torch.testing.assert_close(again(x), module(x))\n"
        "assert Path('model.ptrt').is_file()\n"
    ),
    "docs/guides/passes-and-converters.md": (
        # the GeLU override registers on the same registry as the user's op; the rewrite rule removed the Div
        "assert [str(k) for k in registry.op_keys()][-2:] == ['mylib::shifted_relu', 'Gelu']\n"
        "ops = [n.op_type for n in rewritten.onnx.graph.node]\n"
        "assert 'Div' not in ops and 'Mul' in ops, ops\n"
    ),
    "docs/guides/compare.md": (
        "from pathlib import Path\n"
        "assert report.first_divergence.layer.module == '2.act' and again.passed\n"
        "assert Path('out/compare/report.md').is_file()\n"
    ),
    "docs/guides/quantization.md": (
        "assert report.precision == 'int8' and report.share == 1.0\n"
        "assert len(report.scales()) == 2  # the Conv's and the Linear's activations\n"
    ),
    "docs/guides/precision.md": (
        "from pathlib import Path\n"
        "kept = module.report.precision\n"
        "assert kept.precision == 'fp16' and Path('islands.json').is_file()\n"
        "assert any(i.source == 'user' and i.module == '3' for i in kept.islands)\n"
        "assert {i.node for i in again.report.precision.islands} == {i.node for i in kept.islands}\n"
    ),
    "docs/guides/plugins.md": (
        "assert any(n.op_type == 'topk_mask' and n.domain == 'ai.onnx.contrib' for n in module.onnx.graph.node)\n"
    ),
}
#: Our own warnings a page's examples are expected to print (the first words of the message).
EXPECTED_WARNINGS: dict[str, tuple[str, ...]] = {
    "docs/guides/engines-and-tensorrt-rtx.md": ("engine built for", "SegmentFallbackWarning: "),
}


def test_pages_exist() -> None:
    assert {"docs/index.md", "docs/getting-started.md", "docs/guides/convert.md", "docs/model_coverage.md"} <= set(
        PAGES
    )
    assert len(RUNNABLE) >= 10, RUNNABLE


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """The site builds without a warning; the API reference pages hold the docstrings of the names they list."""
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stderr[-6000:]
    api = (site / "reference" / "pipeline" / "index.html").read_text()
    assert "pipeline.convert" in api and "Convert" in api  # rendered from convert's docstring
    for page in ("guides/compare/index.html", "index.html"):
        assert (site / page).is_file()
    assert (site / "images" / "compare-layers.png").is_file()


@pytest.mark.parametrize("page", PAGES)
def test_blocks_are_marked(page: str) -> None:
    """Every block is python, bash, console or text; a skipped one says why."""
    assert problems(page) == []


@pytest.mark.parametrize("page", RUNNABLE)
def test_examples_run(page: str, tmp_path: Path) -> None:
    runs = run_page(page, make_workdir(tmp_path), CHECKS.get(page, ""))
    for run in runs:
        assert run.returncode == 0, f"{run.what}\n{run.stderr[-4000:]}"
        assert third_party_lines(run.stderr, EXPECTED_WARNINGS.get(page, ())) == [], f"{run.what}\n{run.stderr}"


def test_the_harness_reads_skips_and_languages(tmp_path: Path) -> None:
    """The harness itself: a skip comment needs a reason, an unknown language is an error, a skipped block and a
    text block are not run, a console block's output lines are not commands."""
    text = (
        "<!-- skip: needs a GPU -->\n```python\nraise SystemExit(1)\n```\n\n"
        "<!-- skip: -->\n```bash\npip install x\n```\n\n"
        "```sh\nls\n```\n\n```text\nout\n```\n\n```console\n$ pipeline --version\n0.1.0\n```\n"
    )
    found = blocks("x.md", text)
    assert [(b.language, b.skip) for b in found] == [
        ("python", "needs a GPU"),
        ("bash", ""),
        ("sh", None),
        ("text", None),
        ("console", None),
    ]
    assert commands(found[4]) == ["pipeline --version"]
    assert problems("x.md", text) == [
        "x.md:7: a skip comment without a reason",
        "x.md:11: a ```sh block: say python, bash, console or text (output)",
    ]
