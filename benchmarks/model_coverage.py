"""Model coverage: timm, torchvision, transformers and diffusers models through ``pipeline.convert`` with
TensorRT-RTX (fp32 and fp16), beside plain ``torch.onnx.export`` + ONNX Runtime + the same build.

The models and their classification are ``tests/model_suite.py``'s (lists in ``tests/model_sources/``). Each model
runs in its own subprocess (``--jobs`` at a time) under a deadline (``--timeout`` per side, plus start-up): a model
that hangs is killed and recorded as ``timeout``, one whose process dies as ``crash``. Rows are appended to
``<out>.partial.csv`` as they come, so a killed run resumes where it stopped; at the end they are merged into the
existing table (rows not run this time are kept: ``--models`` re-runs a subset) and ``docs/model_coverage.csv`` and
``docs/model_coverage.md`` are written atomically.

Run from the repository root::

    python benchmarks/model_coverage.py --jobs 2                       # everything (hours on 2 cores)
    python benchmarks/model_coverage.py --sources transformers --models 'mixtral|qwen2_moe'
    python benchmarks/model_coverage.py --render-only                  # the table from a partial run
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the repository's packages first, then the test harness

SIDES = ("fp32", "fp16", "plain")
COLUMNS = ["model", "source", "family", "owner"] + [f"{s}{x}" for s in SIDES for x in ("", "_reason", "_seconds")]
COLUMNS.append("timing")  # "warm": first-use costs paid before the sides were timed (model_suite.warm_up)
START_SECONDS = 90  # importing torch and the model library, building the model, before the first side starts


def child(case_id: str, timeout: float, result: Path) -> None:
    """Inside the subprocess: run one model's sides and write its row to ``result`` as JSON."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import tests_environment  # noqa: F401 -- torchvision's operator schemas before any model library
    import torch

    torch.set_num_threads(1)
    import model_suite

    source = case_id.split("/", 1)[0]
    case = model_suite.all_cases((source,))[case_id]
    model_suite.warm_up(case, timeout)
    turn = zlib.crc32(case_id.encode()) % len(SIDES)  # the sides in a rotated order: what warming leaves is shared
    outcome = model_suite.run_case(case, SIDES[turn:] + SIDES[:turn], timeout)
    row = {"model": case.name, "source": case.source, "family": case.family, "owner": case.owner, "timing": "warm"}
    for side in SIDES:
        row |= {side: outcome.outcomes[side].status, f"{side}_reason": outcome.outcomes[side].reason,
                f"{side}_seconds": f"{outcome.seconds[side]:.1f}"}
    result.write_text(json.dumps(row))


def _failed_row(case_id: str, status: str, reason: str, seconds: float) -> dict[str, str]:
    source, name = case_id.split("/", 1)
    row = {"model": name, "source": source, "family": "", "owner": ""}
    for side in SIDES:
        row |= {side: status, f"{side}_reason": reason, f"{side}_seconds": f"{seconds / len(SIDES):.1f}"}
    return row


def run_one(case_id: str, timeout: float, log: str) -> dict[str, str]:
    """One model in its own process, killed at its deadline."""
    deadline = timeout * (len(SIDES) + 1) + START_SECONDS  # the warm-up has a side's deadline too
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "row.json"
        command = [sys.executable, __file__, "--child", case_id, "--timeout", str(timeout), "--result", str(result)]
        start = time.monotonic()
        with open(log, "ab") as out:
            try:
                process = subprocess.run(command, stdout=out, stderr=out, timeout=deadline, check=False)
            except subprocess.TimeoutExpired:
                return _failed_row(case_id, "timeout", f"timeout: killed after {deadline:g} s", deadline)
        if result.exists():
            return json.loads(result.read_text())
        reason = f"crash: the model's process died (exit code {process.returncode})"
        return _failed_row(case_id, "crash", reason, time.monotonic() - start)


def interleaved(cases: list[Any]) -> list[str]:
    """The ids of ``cases`` taking one source, then one family within it, in turn: a run stopped early has a
    sample of every source and family rather than all of the first."""
    groups: dict[str, dict[str, list[str]]] = {}
    for case in cases:
        groups.setdefault(case.source, {}).setdefault(case.family, []).append(case.id)
    per_source = [_round_robin(list(families.values())) for families in groups.values()]
    return _round_robin(per_source)


def _round_robin(lists: list[list[str]]) -> list[str]:
    out: list[str] = []
    for index in range(max((len(x) for x in lists), default=0)):
        out += [x[index] for x in lists if index < len(x)]
    return out


def read_rows(path: Path) -> dict[str, dict[str, str]]:
    """The rows of a coverage CSV (or of a partial one) by model id; empty when it does not exist."""
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("model") and r.get("plain_seconds")]  # a whole line
    return {f"{r['source']}/{r['model']}": r for r in rows}


def _write_atomically(path: Path, text: str) -> None:
    from converters.files import write_file_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomically(path, text.encode())


def csv_text(rows: list[dict[str, str]]) -> str:
    """The coverage CSV: one row per model."""
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def totals(rows: list[dict[str, str]]) -> dict[str, int]:
    """Models, those PyTorch runs, and the ok count of each side among them."""
    runs = [r for r in rows if r["fp32"] != "pytorch"]
    return {"models": len(rows), "runs": len(runs), **{side: sum(r[side] == "ok" for r in runs) for side in SIDES}}


def _share(count: int, total: int) -> str:
    return f"{count} ({100 * count / max(total, 1):.0f}%)"


def headline(rows: list[dict[str, str]]) -> str:
    """"Of N models PyTorch runs here: X convert, match and build in fp32, Y in fp16; plain export Z"."""
    t = totals(rows)
    return (f"Of {t['runs']} models PyTorch runs here, {_share(t['fp32'], t['runs'])} convert, match and build "
            f"with TensorRT-RTX in fp32 and {_share(t['fp16'], t['runs'])} in fp16; plain export matches and builds "
            f"{_share(t['plain'], t['runs'])}")


def _cell(text: str, limit: int = 200) -> str:
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.replace("|", "\\|").replace("\n", " ") or " "


def _time_ratio(rows: list[dict[str, str]], side: str) -> str:
    """The median of ours / plain seconds over the models both pass, timed warm (rows timed cold are left out: the
    side run first in the process paid everyone's first-use costs)."""
    ratios = [float(r[f"{side}_seconds"]) / float(r["plain_seconds"]) for r in rows
              if r[side] == "ok" and r["plain"] == "ok" and float(r["plain_seconds"] or 0) > 0
              and r.get("timing") == "warm"]
    return f"{statistics.median(ratios):.2f}x" if ratios else "-"


def markdown(rows: list[dict[str, str]], command: str) -> str:
    """The coverage page: headline, totals per source and per class, one row per model."""
    import model_suite
    import tensorrt_rtx
    import torch

    minutes = sum(float(r[f"{s}_seconds"] or 0) for r in rows for s in SIDES) / 60
    untimed = sum(r.get("timing") != "warm" for r in rows)
    cold = (f"; {untimed} rows timed without that warm-up (ours ran first and paid the process's first-use costs for "
            "all three sides) are left out of the ratios") if untimed else ""
    lines = [
        "# Model coverage: timm, torchvision, transformers and diffusers through `pipeline.convert` and TensorRT-RTX",
        "", f"**{headline(rows)}.**", "",
        f"Generated by `{command}` (torch {torch.__version__}, tensorrt-rtx {tensorrt_rtx.__version__}, "
        f"{minutes:.0f} min of per-model time). Random weights, a seeded sample at a small input size, nothing "
        "downloaded (`tests/model_sources/`). **ours**: `pipeline.convert(model, sample, backend=\"tensorrt-rtx\", "
        "precision=...)`: export, passes, the real TensorRT-RTX parse and build, validation against PyTorch on ONNX "
        "Runtime (the engine's stand-in here; no GPU). **plain**: `torch.onnx.export(dynamo=True)`, its graph on ONNX "
        f"Runtime against PyTorch (atol = rtol = {model_suite.PLAIN_TOLERANCE:g}) and the same build. Percentages "
        "count the models PyTorch runs here (class `pytorch` excluded). Time: the median ratio of ours to plain "
        "export's seconds on the models both pass, each model's process warmed first (its libraries and its own "
        f"first export, untimed) and its sides run in an order rotated from model to model{cold}.", "",
        "## Totals per source", "",
        "| source | models | PyTorch runs | ours fp32 | ours fp16 | plain export | time fp32 / plain "
        "| time fp16 / plain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for source in (*sorted({r["source"] for r in rows}), "all"):
        part = [r for r in rows if source in ("all", r["source"])]
        t = totals(part)
        lines.append(f"| {source} | {t['models']} | {t['runs']} | {_share(t['fp32'], t['runs'])} | "
                     f"{_share(t['fp16'], t['runs'])} | {_share(t['plain'], t['runs'])} | "
                     f"{_time_ratio(part, 'fp32')} | {_time_ratio(part, 'fp16')} |")
    counts = {side: Counter(r[side] for r in rows) for side in SIDES}
    lines += ["", "## Totals per class", "", "| class | ours fp32 | ours fp16 | plain export |", "|---|---:|---:|---:|"]
    for status in model_suite.STATUSES:
        if any(counts[s][status] for s in SIDES):
            lines.append(f"| {status} | {counts['fp32'][status]} | {counts['fp16'][status]} | "
                         f"{counts['plain'][status]} |")
        if status == "ok":  # ok through the fallback: part of the graph runs on ONNX Runtime, not TensorRT
            fallback = {s: sum(r[s] == "ok" and r[f"{s}_reason"].startswith("segments:") for r in rows)
                        for s in ("fp32", "fp16")}
            lines.append(f"| of which with ONNX Runtime segments | {fallback['fp32']} | {fallback['fp16']} | - |")
    lines += ["", "## Models", "",
              "| model | family | fp32 | fp16 | plain export | reason (first failing side, or ONNX Runtime segments) |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        reason = (next((r[f"{s}_reason"] for s in SIDES if r[s] != "ok"), "")
                  or next((r[f"{s}_reason"] for s in ("fp32", "fp16") if r[f"{s}_reason"]), ""))
        owner = f" (owned by {r['owner']})" if r["owner"] and reason else ""
        lines.append(f"| `{r['source']}/{r['model']}` | {r['family']} | {r['fp32']} | {r['fp16']} | {r['plain']} | "
                     f"{_cell(reason + owner)} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="models at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per model and side (default 300)")
    parser.add_argument("--sources", default="timm,torchvision,transformers,diffusers", help="comma-separated")
    parser.add_argument("--models", default="", help="regex: only the model ids (source/name) it matches")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "model_coverage", help="path without suffix")
    parser.add_argument("--fresh", action="store_true", help="ignore a partial run and the existing table")
    parser.add_argument("--render-only", action="store_true", help="run nothing: write the table from the rows")
    parser.add_argument("--log", default=os.devnull, help="where the model processes' output goes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _command(args: argparse.Namespace) -> str:
    command = "python benchmarks/model_coverage.py"
    return command + (f" --models '{args.models}'" if args.models else "")


def main(argv: list[str] | None = None) -> int:
    """Run the selected models (skipping those a partial run finished) and write the table."""
    args = parse_args(argv)
    if args.child:
        child(args.child, args.timeout, args.result)
        return 0
    import model_suite
    import tests_environment  # noqa: F401

    table, partial = args.out.with_suffix(".csv"), Path(f"{args.out}.partial.csv")
    if args.fresh:
        partial.unlink(missing_ok=True)
    cases = model_suite.all_cases(tuple(args.sources.split(",")))
    ids = interleaved([c for i, c in cases.items() if re.search(args.models, i)])
    done = read_rows(partial)
    todo = [] if args.render_only else [i for i in ids if i not in done]
    print(f"{len(ids)} models selected, {len(done)} done by a partial run, {len(todo)} to run", flush=True)
    start = time.monotonic()
    if partial.exists() and partial.read_text().partition("\n")[0] != ",".join(COLUMNS):  # an older layout
        _write_atomically(partial, csv_text(list(done.values())))
    new_partial = not partial.exists() or partial.stat().st_size == 0  # a run killed before its first row
    with partial.open("a", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore", lineterminator="\n")
        if new_partial:
            writer.writeheader()
            f.flush()  # else a run killed before its first row leaves an empty file and the rows lose their header
        with ThreadPoolExecutor(args.jobs) as pool:  # rows written as they finish: a killed run loses none
            futures = [pool.submit(run_one, i, args.timeout, args.log) for i in todo]
            for future in as_completed(futures):
                row = future.result()
                writer.writerow(row)
                f.flush()
                done[f"{row['source']}/{row['model']}"] = row
                print(f"[{len(done)}] {row['source']}/{row['model']}: {row['fp32']} {row['fp16']} plain {row['plain']} "
                      f"{next((row[s + '_reason'] for s in SIDES if row[s] != 'ok'), '')[:100]}", flush=True)
    merged = {} if args.fresh else read_rows(table)
    merged.update(done)
    order = {source: index for index, source in enumerate(("timm", "torchvision", "transformers", "diffusers"))}
    rows = sorted(merged.values(), key=lambda r: (order.get(r["source"], 9), r["family"], r["model"]))
    _write_atomically(table, csv_text(rows))
    _write_atomically(args.out.with_suffix(".md"), markdown(rows, _command(args)))
    if not args.render_only:
        partial.unlink(missing_ok=True)
    print(f"{headline(rows)}; {len(todo)} models in {(time.monotonic() - start) / 60:.1f} min; wrote {table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
