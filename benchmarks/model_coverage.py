"""Model coverage: timm, torchvision, transformers and diffusers models through ``pipeline.convert`` with
TensorRT-RTX (fp32 and fp16), beside plain ``torch.onnx.export`` + ONNX Runtime + the same build.

The models and their classification are ``tests/model_suite.py``'s (lists in ``tests/model_sources/``). Each model
runs in its own worker process (``--jobs`` at a time; ``benchmarks/coverage_runner.py``) under a deadline
(``--timeout`` per side, plus start-up): a model that hangs is killed and recorded as ``timeout``, one whose process
dies as ``crash``. Rows are appended to
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
import functools
import os
import re
import statistics
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the repository's packages first, then the test harness and the runner beside this script
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from coverage_runner import Work, cell, csv_text, record_rows, resume, run_all, write_atomically  # noqa: E402
from coverage_runner import read_rows as read_table  # noqa: E402

SIDES = ("fp32", "fp16", "plain")
COLUMNS = ["model", "source", "family", "owner"] + [f"{s}{x}" for s in SIDES for x in ("", "_reason", "_seconds")]
COLUMNS.append("timing")  # "warm": first-use costs paid before the sides were timed (model_suite.warm_up)
#: The order of the sources in the tables.
SOURCE_ORDER = {source: index for index, source in enumerate(("timm", "torchvision", "transformers", "diffusers"))}
#: A source with at most this many families gets a row per family in the table of totals per family.
FAMILY_ROWS = 12
START_SECONDS = 90  # importing torch and the model library, building the model, before the first side starts


def _setup() -> None:
    """In each worker process: torchvision's operator schemas before any model library, torch on one thread."""
    import tests_environment  # noqa: F401
    import torch

    torch.set_num_threads(1)
    import model_suite  # noqa: F401


def run_model(case_id: str, timeout: float) -> dict[str, str]:
    """In a worker process: one model's sides, its row."""
    import model_suite

    source = case_id.split("/", 1)[0]
    case = model_suite.all_cases((source,))[case_id]
    model_suite.warm_up(case, timeout)
    turn = zlib.crc32(case_id.encode()) % len(SIDES)  # the sides in a rotated order: what warming leaves is shared
    outcome = model_suite.run_case(case, SIDES[turn:] + SIDES[:turn], timeout)
    row = {"model": case.name, "source": case.source, "family": case.family, "owner": case.owner, "timing": "warm"}
    for side in SIDES:
        row |= {
            side: outcome.outcomes[side].status,
            f"{side}_reason": outcome.outcomes[side].reason,
            f"{side}_seconds": f"{outcome.seconds[side]:.1f}",
        }
    return row


def _failed_row(
    case_id: str, status: str, reason: str, seconds: float, families: dict[str, str] | None = None
) -> dict[str, str]:
    source, name = case_id.split("/", 1)
    row = {"model": name, "source": source, "family": (families or {}).get(case_id, ""), "owner": ""}
    for side in SIDES:
        row |= {side: status, f"{side}_reason": reason, f"{side}_seconds": f"{seconds / len(SIDES):.1f}"}
    return row


def _work(args: argparse.Namespace, families: dict[str, str] | None = None) -> Work:
    """A fresh process per model, killed at its deadline."""
    return Work(
        setup=_setup,
        run=functools.partial(run_model, timeout=args.timeout),
        deadline=args.timeout * (len(SIDES) + 1) + START_SECONDS,  # the warm-up has a side's deadline too
        failed_row=functools.partial(_failed_row, families=families),
        crash="crash: the model's process died (exit code {code})",
        per_worker=1,
        log=args.log,
    )


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


def _model_id(row: dict[str, str]) -> str:
    return f"{row['source']}/{row['model']}"


def read_rows(path: Path) -> dict[str, dict[str, str]]:
    """The rows of a coverage CSV (or of a partial one) by model id; empty when it does not exist."""
    return read_table(path, _model_id, "plain_seconds")  # a whole line


def totals(rows: list[dict[str, str]]) -> dict[str, int]:
    """Models, those PyTorch runs, and the ok count of each side among them."""
    runs = [r for r in rows if r["fp32"] != "pytorch"]
    return {"models": len(rows), "runs": len(runs), **{side: sum(r[side] == "ok" for r in runs) for side in SIDES}}


def _share(count: int, total: int) -> str:
    return f"{count} ({100 * count / max(total, 1):.0f}%)"


def headline(rows: list[dict[str, str]]) -> str:
    """ "Of N models PyTorch runs here: X convert, match and build in fp32, Y in fp16; plain export Z"."""
    t = totals(rows)
    return (
        f"Of {t['runs']} models PyTorch runs here, {_share(t['fp32'], t['runs'])} convert, match and build "
        f"with TensorRT-RTX in fp32 and {_share(t['fp16'], t['runs'])} in fp16; plain export matches and builds "
        f"{_share(t['plain'], t['runs'])}"
    )


def _time_ratio(rows: list[dict[str, str]], side: str) -> str:
    """The median of ours / plain seconds over the models both pass, timed warm (rows timed cold are left out: the
    side run first in the process paid everyone's first-use costs)."""
    ratios = [
        float(r[f"{side}_seconds"]) / float(r["plain_seconds"])
        for r in rows
        if r[side] == "ok" and r["plain"] == "ok" and float(r["plain_seconds"] or 0) > 0 and r.get("timing") == "warm"
    ]
    return f"{statistics.median(ratios):.2f}x" if ratios else "-"


def markdown(rows: list[dict[str, str]], command: str) -> str:
    """The coverage page: headline, totals per source and per class, one row per model."""
    import model_suite
    import tensorrt_rtx
    import torch

    minutes = sum(float(r[f"{s}_seconds"] or 0) for r in rows for s in SIDES) / 60
    untimed = sum(r.get("timing") != "warm" for r in rows)
    cold = (
        (
            f"; {untimed} rows timed without that warm-up (ours ran first and paid the process's first-use costs for "
            "all three sides) are left out of the ratios"
        )
        if untimed
        else ""
    )
    present = sorted({r["source"] for r in rows}, key=lambda source: (SOURCE_ORDER.get(source, 9), source))
    sources = ", ".join(present[:-1]) + f" and {present[-1]}" if len(present) > 1 else "".join(present)
    lines = [
        f"# Model coverage: {sources} through `pipeline.convert` and TensorRT-RTX",
        "",
        f"**{headline(rows)}.**",
        "",
        f"Generated by `{command}` (torch {torch.__version__}, tensorrt-rtx {tensorrt_rtx.__version__}, "
        f"{minutes:.0f} min of per-model time). Random weights, a seeded sample at a small input size, nothing "
        'downloaded (`tests/model_sources/`). **ours**: `pipeline.convert(model, sample, backend="tensorrt-rtx", '
        "precision=...)`: export, passes, the real TensorRT-RTX parse and build, validation against PyTorch on ONNX "
        "Runtime (the engine's stand-in here; no GPU). **plain**: `torch.onnx.export(dynamo=True)`, its graph on ONNX "
        f"Runtime against PyTorch (atol = rtol = {model_suite.PLAIN_TOLERANCE:g}) and the same build. Percentages "
        "count the models PyTorch runs here (class `pytorch` excluded). Time: the median ratio of ours to plain "
        "export's seconds on the models both pass, each model's process warmed first (its libraries and its own "
        f"first export, untimed) and its sides run in an order rotated from model to model{cold}.",
        "",
        "## Totals per source",
        "",
        "| source | models | PyTorch runs | ours fp32 | ours fp16 | plain export | time fp32 / plain "
        "| time fp16 / plain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for source in (*sorted({r["source"] for r in rows}), "all"):
        part = [r for r in rows if source in ("all", r["source"])]
        t = totals(part)
        lines.append(
            f"| {source} | {t['models']} | {t['runs']} | {_share(t['fp32'], t['runs'])} | "
            f"{_share(t['fp16'], t['runs'])} | {_share(t['plain'], t['runs'])} | "
            f"{_time_ratio(part, 'fp32')} | {_time_ratio(part, 'fp16')} |"
        )
    lines += [
        "",
        "## Totals per family",
        "",
        "| source | family | models | PyTorch runs | ours fp32 | ours fp16 | plain export |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    grouped = {source: {r["family"] for r in rows if r["source"] == source} for source in {r["source"] for r in rows}}
    # a source whose families are single models (timm's modules, torchvision's groups) has its models' table only
    for source, family in sorted((s, f) for s, fs in grouped.items() if len(fs) <= FAMILY_ROWS for f in fs):
        t = totals([r for r in rows if (r["source"], r["family"]) == (source, family)])
        lines.append(
            f"| {source} | {family} | {t['models']} | {t['runs']} | {_share(t['fp32'], t['runs'])} | "
            f"{_share(t['fp16'], t['runs'])} | {_share(t['plain'], t['runs'])} |"
        )
    counts = {side: Counter(r[side] for r in rows) for side in SIDES}
    lines += ["", "## Totals per class", "", "| class | ours fp32 | ours fp16 | plain export |", "|---|---:|---:|---:|"]
    for status in model_suite.STATUSES:
        if any(counts[s][status] for s in SIDES):
            lines.append(
                f"| {status} | {counts['fp32'][status]} | {counts['fp16'][status]} | {counts['plain'][status]} |"
            )
        if status == "ok":  # ok through the fallback: part of the graph runs on ONNX Runtime, not TensorRT
            fallback = {
                s: sum(r[s] == "ok" and r[f"{s}_reason"].startswith("segments:") for r in rows)
                for s in ("fp32", "fp16")
            }
            lines.append(f"| of which with ONNX Runtime segments | {fallback['fp32']} | {fallback['fp16']} | - |")
    lines += [
        "",
        "## Models",
        "",
        "| model | family | fp32 | fp16 | plain export | reason (first failing side, or ONNX Runtime segments) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        reason = next((r[f"{s}_reason"] for s in SIDES if r[s] != "ok"), "") or next(
            (r[f"{s}_reason"] for s in ("fp32", "fp16") if r[f"{s}_reason"]), ""
        )
        owner = f" (owned by {r['owner']})" if r["owner"] and reason else ""
        lines.append(
            f"| `{r['source']}/{r['model']}` | {r['family']} | {r['fp32']} | {r['fp16']} | {r['plain']} | "
            f"{cell(reason + owner, 200)} |"
        )
    return "\n".join(lines) + "\n"


#: The README's family rows, in this order (the every-type source's families).
README_FAMILIES = (
    "encoder", "decoder", "encoder-decoder", "vision", "audio", "multimodal", "moe", "state-space", "other",
)  # fmt: skip


def readme_table(rows: list[dict[str, str]]) -> str:
    """The README's coverage table of a source by family: the types PyTorch runs, ours in fp32 and fp16, plain
    export; and the total."""
    lines = [
        "| family | run eagerly | ours fp32 | ours fp16 | plain export |",
        "|---|---:|---:|---:|---:|",
    ]
    families = [f for f in README_FAMILIES if any(r["family"] == f for r in rows)]
    families += sorted({r["family"] for r in rows} - set(families))
    for family in (*families, "all"):
        t = totals([r for r in rows if family in ("all", r["family"])])
        name = "**all**" if family == "all" else family or "(unread)"
        lines.append(
            f"| {name} | {t['runs']} | {_share(t['fp32'], t['runs'])} | {_share(t['fp16'], t['runs'])} | "
            f"{_share(t['plain'], t['runs'])} |"
        )
    return "\n".join(lines)


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
    parser.add_argument("--readme", action="store_true", help="run nothing: print the README's table by family")
    parser.add_argument("--log", default=os.devnull, help="where the model processes' output goes")
    return parser.parse_args(argv)


def _command(args: argparse.Namespace) -> str:
    command = "python benchmarks/model_coverage.py"
    if args.sources != parse_args([]).sources:
        out = args.out.resolve()
        command += f" --sources {args.sources} --out {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}"
    return command + (f" --models '{args.models}'" if args.models else "")


def main(argv: list[str] | None = None) -> int:
    """Run the selected models (skipping those a partial run finished) and write the table."""
    args = parse_args(argv)
    import model_suite
    import tests_environment  # noqa: F401

    table, partial = args.out.with_suffix(".csv"), Path(f"{args.out}.partial.csv")
    cases = model_suite.all_cases(tuple(args.sources.split(",")))
    if args.readme:
        rows = list({**read_rows(table), **read_rows(partial)}.values())
        for row in rows:  # rows of models killed before the runner knew their family
            row["family"] = row["family"] or getattr(cases.get(_model_id(row)), "family", "")
        print(readme_table(rows))
        return 0
    ids = interleaved([c for i, c in cases.items() if re.search(args.models, i)])
    done = resume(partial, COLUMNS, _model_id, "plain_seconds", args.fresh)
    todo = [] if args.render_only else [i for i in ids if i not in done]
    print(f"{len(ids)} models selected, {len(done)} done by a partial run, {len(todo)} to run", flush=True)

    def progress(row: dict[str, str]) -> None:
        done[_model_id(row)] = row
        print(
            f"[{len(done)}] {row['source']}/{row['model']}: {row['fp32']} {row['fp16']} plain {row['plain']} "
            f"{next((row[s + '_reason'] for s in SIDES if row[s] != 'ok'), '')[:100]}",
            flush=True,
        )

    start = time.monotonic()
    if todo:  # rows written as they finish: a killed run loses none
        families = {i: c.family for i, c in cases.items()}  # a killed model's row has its family too
        work = _work(args, families)
        record_rows(partial, COLUMNS, lambda write: run_all(todo, work, args.jobs, write), progress)
    merged = {} if args.fresh else read_rows(table)
    merged.update(done)
    for row in merged.values():  # rows of models killed before the runner knew their family
        row["family"] = row["family"] or getattr(cases.get(_model_id(row)), "family", "")
    rows = sorted(merged.values(), key=lambda r: (SOURCE_ORDER.get(r["source"], 9), r["family"], r["model"]))
    write_atomically(table, csv_text(rows, COLUMNS))
    write_atomically(args.out.with_suffix(".md"), markdown(rows, _command(args)))
    if not args.render_only:
        partial.unlink(missing_ok=True)
    print(f"{headline(rows)}; {len(todo)} models in {(time.monotonic() - start) / 60:.1f} min; wrote {table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
