"""PyTorch's OpInfo samples through pipeline.convert (ONNX Runtime) and the real TensorRT-RTX builder.

Each case wraps one op on its usable samples (``tests/opinfo_support.py``) and asserts what a user relies on:

- every sample ends in "ok" (converts, matches PyTorch, builds) or in one of OUR errors whose message names the op;
  never a raw exception (class "crash") or a hang (class "timeout"). (A TensorRT-RTX rejection is TensorRT's own
  text, which usually names the node but not always: "model: Unsupported reduction type"; it is not held to this.)
- an op the committed table (``docs/op_coverage.csv``, written by ``benchmarks/opinfo_coverage.py``) lists as ok is
  still ok on the table's sample (its first usable one): a regression test against the table.

Which ops run is deterministic, so a failure reproduces. By default a stratified subset of the table: every
``STRIDE``-th op of each class (ok, export, accuracy, parser, ...), float32 on ``DEFAULT_SAMPLES`` samples and
float16 (``precision="fp16"``, the float32 sample) on every ``FP16_STRIDE``-th of those. ``OPINFO_ALL=1`` runs every
op with a usable sample; ``OPINFO_SHARD=i/n`` the i-th of n shards (both: ``OPINFO_SAMPLES`` samples, default 3, and
float16 for all; marked slow). A case whose every failure matches a known bug (``KNOWN_BUGS``: the failure's
signature and the work item that fixes it) ends as xfail with that reason; a regression of a table-ok op never does.
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import opinfo_support as support
import pytest
from rtx_build import SKIP_REASON

from pipeline.precision.buildable import rtx_available

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "op_coverage.csv"
STRIDE = 12  # about 50 of ~620 ops with a usable sample
FP16_STRIDE = 4
DEFAULT_SAMPLES = 2
CASE_TIMEOUT = 120.0

needs_rtx = pytest.mark.skipif(not rtx_available(), reason=SKIP_REASON)


def _table() -> dict[str, dict[str, str]]:
    if not TABLE.exists():
        return {}
    with TABLE.open(newline="") as f:
        return {row["op"]: row for row in csv.DictReader(f)}


TABLE_ROWS = _table()


def _stratified(rows: dict[str, dict[str, str]], stride: int) -> list[str]:
    """Every ``stride``-th op of each class (sorted by name within the class), at least one per class."""
    by_class: dict[str, list[str]] = {}
    for name, row in rows.items():
        if row["status"] != "no usable sample":
            by_class.setdefault(row["status"], []).append(name)
    return sorted(name for names in by_class.values() for name in sorted(names)[::stride])


def _selection() -> tuple[list[str], list[str], int, bool]:
    """(float32 ops, float16 ops, samples per op, slow) from the environment (see the module docstring)."""
    shard = os.environ.get("OPINFO_SHARD", "")
    if os.environ.get("OPINFO_ALL") == "1" or shard:
        names = sorted(TABLE_ROWS) if TABLE_ROWS else []
        if shard:
            index, count = (int(part) for part in shard.split("/"))
            names = names[index::count]
        return names, names, int(os.environ.get("OPINFO_SAMPLES", "3")), True
    fp32 = _stratified(TABLE_ROWS, STRIDE)
    return fp32, fp32[::FP16_STRIDE], DEFAULT_SAMPLES, False


FP32_OPS, FP16_OPS, SAMPLES, SLOW = _selection()


# Known bugs, by the signature of the failure they cause, with the work item that fixes them. A case whose failures
# all match these ends as xfail with the reason; any other failure fails. Remove an entry when its fix is merged.
KNOWN_BUGS: dict[str, str] = {
    r"ONNX Runtime could not load the final graph": "BuildError from ONNX Runtime names no node (issue 14, other)",
    r"No corresponding Numpy type for Tensor Type\. bfloat16": "a raw error on a bfloat16 output (issue 14, other)",
}


def _params(names: list[str]) -> list[object]:
    marks = [pytest.mark.slow] if SLOW else []
    return [pytest.param(name, id=name, marks=marks) for name in names]


def _known(failure: str) -> str | None:
    return next((why for pattern, why in KNOWN_BUGS.items() if re.search(pattern, failure)), None)


def _check(name: str, dtype: str, samples: int) -> None:
    """Every usable sample ends in ok or in our error naming the op; a table-ok op stays ok on its first sample."""
    op = support.all_ops()[name]
    found, why = support.usable_samples(op, samples)
    if not found:
        pytest.skip(f"{name}: no usable sample ({why})")
    row = TABLE_ROWS.get(name, {})
    failures, regressions = [], []
    for index, sample in enumerate(found):
        outcome = support.run_ours(op, sample, dtype, CASE_TIMEOUT)
        where = f"{name} ({dtype}, sample {index})"
        if index == 0 and dtype == "float32" and row.get("status") == "ok" and not outcome.ok:
            regressions.append(f"{where}: docs/op_coverage.csv lists it as ok, now {outcome.status}: {outcome.reason}")
        if outcome.status in ("crash", "timeout"):
            failures.append(f"{where}: {outcome.status}, a bug: {outcome.reason}")
        elif not outcome.ok and not outcome.names_op and not outcome.reason.startswith("TensorRT-RTX "):
            failures.append(f"{where}: the {outcome.status} error does not name the op: {outcome.reason}")
    known = [_known(f) for f in failures]
    if failures and all(known) and not regressions:
        pytest.xfail("known bugs: " + "; ".join(sorted({str(k) for k in known})))
    assert not failures + regressions, "\n".join(failures + regressions)


@needs_rtx
@pytest.mark.parametrize("name", _params(FP32_OPS))
def test_opinfo_float32(name: str) -> None:
    """float32: ours on ONNX Runtime and the TensorRT-RTX build, on several samples of the op."""
    _check(name, "float32", SAMPLES)


@needs_rtx
@pytest.mark.parametrize("name", _params(FP16_OPS))
def test_opinfo_float16(name: str) -> None:
    """float16 (``precision="fp16"`` on the float32 sample): ok, or our error naming the op."""
    _check(name, "float16", 1)


def test_table_covers_every_op() -> None:
    """The committed table has one row per op_db entry, each in a known class (regenerate it when op_db changes:
    ``python benchmarks/opinfo_coverage.py``)."""
    assert TABLE_ROWS, f"{TABLE} is missing: run python benchmarks/opinfo_coverage.py"
    missing = sorted(set(support.all_ops()) - set(TABLE_ROWS))
    assert not missing, f"ops missing from {TABLE.name}: {missing[:20]}"
    unknown = {row["status"] for row in TABLE_ROWS.values()} - set(support.STATUSES)
    assert not unknown, f"unknown classes in {TABLE.name}: {unknown}"
    assert len(FP32_OPS) >= 30, "the default selection is too small to mean anything"


def test_coverage_page_headline_is_the_tables() -> None:
    """docs/coverage.md's "Op coverage" section states the table's headline (``--update-readme`` updates it)."""
    headline = (ROOT / "docs" / "op_coverage.md").read_text().split("**")[1].rstrip(".")
    page = (ROOT / "docs" / "coverage.md").read_text()
    assert "## Op coverage" in page
    section = page.split("## Op coverage", 1)[1].split("\n## ", 1)[0]
    assert headline in section, f"docs/coverage.md's Op coverage section should state: {headline}"
    assert "op_coverage.md" in section
