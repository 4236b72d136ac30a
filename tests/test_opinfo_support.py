"""The OpInfo harness (tests/opinfo_support.py) and the coverage script (benchmarks/opinfo_coverage.py): sample
selection and its reasons, classification of errors, time limits, the table's headline, resuming a partial run."""

from __future__ import annotations

import csv
import importlib.util
import sys
import time
from pathlib import Path

import opinfo_support as support
import pytest
import torch

from converters.errors import AccuracyError, ExportError

ROOT = Path(__file__).resolve().parent.parent


def _coverage_script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("opinfo_coverage", ROOT / "benchmarks" / "opinfo_coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("opinfo_coverage", module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("item", "eager PyTorch returns a float, not tensors"),
        ("arange", "no sample has a tensor argument"),
        ("view_as_complex", "eager PyTorch returns a complex tensor"),
    ],
)
def test_ops_without_usable_sample_say_why(name: str, reason: str) -> None:
    """An op with no usable sample gets the reason, not an attempt."""
    found, why = support.usable_samples(support.all_ops()[name], 3)
    assert (found, why) == ([], reason)


def test_usable_samples_skip_zero_element_tensors() -> None:
    """cholesky_inverse's first OpInfo sample is an empty matrix: the harness takes the next ones, all non-empty."""
    op = support.all_ops()["cholesky_inverse"]
    found, why = support.usable_samples(op, 2)
    assert len(found) == 2 and why == ""
    for sample in found:
        assert sample.input.numel() > 0
    again, _ = support.usable_samples(op, 2)  # seeded: the same samples every time
    assert torch.equal(again[0].input, found[0].input)


def test_wrap_takes_the_sample_tensors_and_matches_eager() -> None:
    """The wrapped module's forward takes exactly the sample's tensors and computes the op."""
    op = support.all_ops()["addcmul"]
    sample = support.usable_samples(op, 1)[0][0]
    model = support.Wrap(op, sample)
    assert len(model.tensors) == 3
    torch.testing.assert_close(model(*model.tensors), op.op(sample.input, *sample.args, **sample.kwargs))


def test_classification_of_errors() -> None:
    """Our errors are classed by stage and checked for naming the op; anything else is a crash."""
    op = support.all_ops()["cummax"]
    named = support.classify_error(ExportError("no ONNX function for aten.cummax.default", fix="register"), op)
    assert (named.status, named.names_op) == ("export", True)
    unnamed = support.classify_error(AccuracyError("outputs differ: out: max abs 3"), op)
    assert (unnamed.status, unnamed.names_op) == ("accuracy", False)
    crash = support.classify_error(AttributeError("'bool' object has no attribute 'max_absdiff'"), op)
    assert crash.status == "crash" and "AttributeError" in crash.reason


def test_time_limit_interrupts_a_case() -> None:
    """A case past its limit ends as CaseTimeout (a BaseException: no `except Exception` swallows it)."""
    start = time.perf_counter()
    with pytest.raises(support.CaseTimeout), support.time_limit(0.2):
        while True:
            time.sleep(0.01)
    assert time.perf_counter() - start < 5


def test_ours_on_a_real_op() -> None:
    """abs converts, matches PyTorch and builds with TensorRT-RTX; plain export builds too."""
    pytest.importorskip("tensorrt_rtx")
    op = support.all_ops()["abs"]
    sample = support.usable_samples(op, 1)[0][0]
    assert support.run_ours(op, sample).status == "ok"
    assert support.run_plain(op, sample).status == "ok"


def _row(op: str, status: str, plain: str = "ok", dtype: str = "float32") -> dict[str, str]:
    return {
        "op": op,
        "status": status,
        "reason": "",
        "names_op": "yes",
        "plain": plain,
        "plain_reason": "",
        "samples": "1",
        "dtype": dtype,
        "seconds": "1.0",
    }


def test_headline_counts_ops_with_a_usable_sample() -> None:
    """The headline's denominator excludes ops without a usable sample; plain export is counted alike."""
    script = _coverage_script()
    rows = [_row("a", "ok"), _row("b", "crash", "ok"), _row("c", "export", "export"), _row("d", "no usable sample")]
    assert script.headline(rows) == "1 of 3 (33%) convert, match and build; plain export builds 2 (67%)"


def test_resume_from_a_partial_run(tmp_path: Path) -> None:
    """Ops a killed run finished (in <out>.partial.csv) are not run again; the table merges them atomically and the
    partial file goes."""
    pytest.importorskip("tensorrt_rtx")
    script = _coverage_script()
    out = tmp_path / "cov"
    partial = Path(f"{out}.partial.csv")
    with partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, script.COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows([_row("abs", "ok"), _row("add", "crash")])
        f.write("acos,ok,")  # a row cut short by the kill: ignored
    assert script.main(["--ops", "^(abs|add)$", "--out", str(out)]) == 0
    rows = script.read_rows(out.with_suffix(".csv"))
    assert [(r["op"], r["status"]) for r in rows.values()] == [("abs", "ok"), ("add", "crash")]
    page = out.with_suffix(".md").read_text()
    assert "**1 of 2 (50%) convert, match and build; plain export builds 2 (100%).**" in page
    assert "| `add` | crash |" in page
    assert not partial.exists()


def test_update_readme_replaces_only_the_sections_headline(tmp_path: Path) -> None:
    """--update-readme rewrites the bold line of the Op coverage section and nothing else."""
    script = _coverage_script()
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n**keep.**\n\n## Op coverage\n\ntext\n\n**old.**\n\nmore\n\n## Next\n\n**keep too.**\n")
    script.update_readme(readme, "3 of 4 (75%) convert, match and build")
    assert readme.read_text() == (
        "# x\n\n**keep.**\n\n## Op coverage\n\ntext\n\n**3 of 4 (75%) convert, match and build.**\n\nmore\n\n"
        "## Next\n\n**keep too.**\n"
    )
