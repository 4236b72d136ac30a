"""Op coverage: every PyTorch OpInfo op through ``pipeline.convert`` and the real TensorRT-RTX builder.

For each ``op_db`` entry (every variant), its first ``--samples`` usable float32 samples are wrapped in a module
(``tests/opinfo_support.py``) and classified twice: ours (``pipeline.convert`` on ONNX Runtime, validated against
PyTorch, then the TensorRT-RTX build of ``module.onnx``) and plain ``torch.onnx.export(dynamo=True)`` + the same build.
Writes ``docs/op_coverage.csv`` and ``docs/op_coverage.md`` (``--dtype float16``: ``docs/op_coverage_float16.*``).

Run from the repository root::

    python benchmarks/opinfo_coverage.py --jobs 2                  # the table (1 sample per op, float32)
    python benchmarks/opinfo_coverage.py --ops '^nn\\.functional\\.' --samples 3
    python benchmarks/opinfo_coverage.py --dtype float16 --no-plain

Each op runs in one of ``--jobs`` worker processes; an op past its deadline (``--timeout`` per sample and
side, plus the sample scan) has its worker killed and is recorded as ``timeout``; a worker that dies (a segfault in a
native library) records ``crash`` and is replaced, so nothing stops the run. Rows are appended to
``<out>.partial.csv`` as they come: a killed run resumes where it stopped. At the end the rows are merged into the
existing table (rows of ops not run this time are kept, so ``--ops`` re-runs a subset) and the CSV and Markdown are
written atomically.
"""

from __future__ import annotations

import argparse
import csv
import io
import multiprocessing
import multiprocessing.connection
import os
import re
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the repository's packages first, then the test harness

COLUMNS = ["op", "status", "reason", "names_op", "plain", "plain_reason", "samples", "dtype", "seconds"]
SCAN_SECONDS = 60  # finding the usable samples (eager runs) before the cases start
MAX_FAILED_STARTS = 3  # workers that die before they are ready: the environment is broken, stop


def _worker(conn: Any, options: dict[str, Any]) -> None:
    """A worker process: run ops sent on ``conn`` and send back their rows, until it receives None."""
    log = os.open(options["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)  # the exporter and TensorRT print: keep the parent's terminal for progress
    os.dup2(log, 2)
    # one thread per worker: --jobs processes share the cores, and idle OpenMP threads spin on a busy machine
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    import opinfo_support as support

    support.all_ops()
    conn.send("ready")
    while True:
        name = conn.recv()
        if name is None:
            return
        result = support.run_op(name, options["samples"], options["dtype"], options["plain"], options["timeout"])
        conn.send(_row(result, options["dtype"]))


def _row(result: Any, dtype: str) -> dict[str, str]:
    return {
        "op": result.op,
        "status": result.ours.status,
        "reason": result.ours.reason,
        "names_op": "yes" if result.ours.names_op else "no",
        "plain": result.plain.status,
        "plain_reason": result.plain.reason,
        "samples": str(result.samples),
        "dtype": dtype,
        "seconds": f"{result.seconds:.1f}",
    }


def _failed_row(name: str, status: str, reason: str, dtype: str, seconds: float) -> dict[str, str]:
    return {
        "op": name,
        "status": status,
        "reason": reason,
        "names_op": "no",
        "plain": status,
        "plain_reason": reason,
        "samples": "",
        "dtype": dtype,
        "seconds": f"{seconds:.1f}",
    }


@dataclass
class Worker:
    """A worker process, its pipe, the op it runs and that op's deadline."""

    process: Any
    conn: Any
    ready: bool = False
    op: str | None = None
    started: float = 0.0
    done: int = 0
    deadline: float = field(default=0.0)


def _start(context: Any, options: dict[str, Any]) -> Worker:
    parent, child = context.Pipe()
    process = context.Process(target=_worker, args=(child, options), daemon=True)
    process.start()
    child.close()
    return Worker(process, parent)


def _stop(worker: Worker) -> None:
    worker.process.kill()
    worker.process.join(10)
    worker.conn.close()


def run_all(names: list[str], options: dict[str, Any], jobs: int, on_row: Any) -> None:
    """Run ``names`` on ``jobs`` workers, calling ``on_row(row)`` for each finished op (in finishing order)."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's thread pools
    pending = list(reversed(names))
    per_op = options["timeout"] * options["samples"] * (2 if options["plain"] else 1) + SCAN_SECONDS
    workers = [_start(context, options) for _ in range(min(jobs, len(names)))]
    failed_starts = 0
    while pending or any(w.op for w in workers):
        now = time.monotonic()
        for index, worker in enumerate(workers):
            if worker.op and now > worker.deadline:
                reason = f"timeout: killed after {per_op:g} s"
                on_row(_failed_row(worker.op, "timeout", reason, options["dtype"], now - worker.started))
                _stop(worker)
                workers[index] = worker = _start(context, options)
            if worker.ready and worker.op is None and pending:
                if worker.done >= options["ops_per_worker"]:  # a fresh process now and then: leaks stay bounded
                    worker.conn.send(None)
                    worker.process.join(30)
                    workers[index] = worker = _start(context, options)
                    continue
                worker.op, worker.started = pending.pop(), now
                worker.deadline = now + per_op
                worker.conn.send(worker.op)
        live = [w.conn for w in workers if not w.conn.closed]
        for conn in multiprocessing.connection.wait(live, timeout=1.0):
            index = next(i for i, w in enumerate(workers) if w.conn is conn)
            worker = workers[index]
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the worker died: a crash of the op it was running (or of its start)
                code = worker.process.exitcode
                name = worker.op
                _stop(worker)
                workers[index] = _start(context, options)
                if name is None:
                    failed_starts += 1
                    if failed_starts > MAX_FAILED_STARTS:
                        raise RuntimeError(f"workers die before they are ready (exit code {code}): see --log") from None
                else:
                    reason = f"crash: the worker process died (exit code {code}) while running the op"
                    on_row(_failed_row(name, "crash", reason, options["dtype"], time.monotonic() - worker.started))
                continue
            if message == "ready":
                worker.ready, failed_starts = True, 0
                continue
            worker.op, worker.done = None, worker.done + 1
            on_row(message)
    for worker in workers:
        if worker.process.is_alive():
            worker.conn.send(None)
            worker.process.join(30)
        _stop(worker)


def read_rows(path: Path) -> dict[str, dict[str, str]]:
    """The rows of a coverage CSV (or of a partial one) by op; empty when it does not exist."""
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        # a row cut short by a kill lacks its last column: it does not count as done
        return {row["op"]: row for row in csv.DictReader(f) if row.get("op") and row.get(COLUMNS[-1])}


def _write_atomically(path: Path, text: str) -> None:
    from converters.files import write_file_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomically(path, text.encode())


def csv_text(rows: list[dict[str, str]]) -> str:
    """The coverage CSV: one row per op, in ``op_db`` order."""
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def headline(rows: list[dict[str, str]]) -> str:
    """"X of N (P%) convert, match and build; plain export builds Y (Q%)", N = ops with a usable sample."""
    usable = [r for r in rows if r["status"] != "no usable sample"]
    ours = sum(r["status"] == "ok" for r in usable)
    plain = sum(r["plain"] == "ok" for r in usable)
    total = max(len(usable), 1)
    text = f"{ours} of {len(usable)} ({100 * ours / total:.0f}%) convert, match and build"
    if any(r["plain"] != "not run" for r in usable):
        text += f"; plain export builds {plain} ({100 * plain / total:.0f}%)"
    return text


def _cell(text: str, limit: int = 220) -> str:
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.replace("|", "\\|").replace("\n", " ") or " "


def markdown(rows: list[dict[str, str]], command: str, dtype: str, samples: int) -> str:
    """The coverage page: headline, totals per class (ours and plain export), one row per op."""
    import opinfo_support as support
    import tensorrt_rtx
    import torch

    ours, plain = Counter(r["status"] for r in rows), Counter(r["plain"] for r in rows)
    unnamed = [r["op"] for r in rows if r["status"] not in ("ok", "no usable sample") and r["names_op"] == "no"]
    lines = [
        f"# Op coverage ({dtype}): PyTorch OpInfo through `pipeline.convert` and TensorRT-RTX",
        "",
        f"**{headline(rows)}.**",
        "",
        f"Generated by `{command}` (torch {torch.__version__}, tensorrt-rtx {tensorrt_rtx.__version__}"
        + f", {_op_minutes(rows):.0f} min of per-op time"
        + f"). Every `op_db` entry (variants included), its first {samples} usable float32 sample(s) "
        + ("run with `precision=\"fp16\"`, " if dtype == "float16" else "")
        + "wrapped in a module whose `forward` takes the sample's tensors (`tests/opinfo_support.py`). **ours**: "
        "`pipeline.convert` (ONNX Runtime, validated against PyTorch) and the real TensorRT-RTX build of "
        "`module.onnx`; **plain export**: `torch.onnx.export(dynamo=True)` and the same build, nothing compared. "
        "The percentages count the ops with a usable sample. An op with several samples shows the first that fails.",
        "",
        "## Totals per class",
        "",
        "| class | ours | plain export | meaning |",
        "|---|---:|---:|---|",
    ]
    for status in (*support.STATUSES, *sorted((set(ours) | set(plain)) - set(support.STATUSES))):
        if ours[status] or plain[status]:
            lines.append(f"| {status} | {ours[status]} | {plain[status]} | {_MEANING.get(status, '')} |")
    lines += ["", f"{len(unnamed)} failing ops get an error that does not name the op (CSV: `names_op` = no).", ""]
    lines += ["## Ops", "", "| op | ours | reason | plain export |", "|---|---|---|---|"]
    for r in rows:
        plain_cell = r["plain"] if r["plain"] in ("ok", "not run") else f"{r['plain']}: {_cell(r['plain_reason'], 100)}"
        lines.append(f"| `{r['op']}` | {r['status']} | {_cell(r['reason'])} | {_cell(plain_cell, 120)} |")
    return "\n".join(lines) + "\n"


def _op_minutes(rows: list[dict[str, str]]) -> float:
    return sum(float(r["seconds"] or 0) for r in rows) / 60


_MEANING = {
    "ok": "converts, matches PyTorch, builds (plain: exports and builds)",
    "no usable sample": "no float32 sample with a real, non-empty tensor argument that eager PyTorch runs to tensors",
    "input": "our InputError",
    "export": "our ExportError (plain: the exporter's error)",
    "convert": "our ConversionError (a pass or converter)",
    "accuracy": "our AccuracyError: the graph departs from PyTorch",
    "parser": "the TensorRT-RTX ONNX parser rejects the final graph",
    "build": "the TensorRT-RTX builder fails (or our BuildError)",
    "timeout": "still running at the deadline",
    "crash": "a raw exception or a dead process: a bug",
    "not run": "plain export skipped (--no-plain)",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1, help="usable samples per op (default 1, the table's)")
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per sample and side (default 120)")
    parser.add_argument("--ops", default="", help="regex: only the op ids it matches (re.search)")
    parser.add_argument("--out", type=Path, help="path without suffix (default docs/op_coverage[_float16])")
    parser.add_argument("--no-plain", action="store_true", help="skip plain torch.onnx.export")
    parser.add_argument("--fresh", action="store_true", help="ignore a partial run and the existing table")
    parser.add_argument("--update-readme", action="store_true", help="put the headline into README.md's section")
    parser.add_argument("--render-only", action="store_true", help="run nothing: write the table from a partial run")
    parser.add_argument("--ops-per-worker", type=int, default=100, help="restart a worker after this many ops")
    parser.add_argument("--log", default=os.devnull, help="where the workers' stdout/stderr go")
    return parser.parse_args(argv)


def update_readme(path: Path, line: str) -> None:
    """Replace the bold headline line of ``path``'s "## Op coverage" section with ``**line.**`` (atomically)."""
    text = path.read_text()
    head, marker, rest = text.partition("## Op coverage\n")
    section, sep, tail = rest.partition("\n## ")
    new_section, count = re.subn(r"(?m)^\*\*.*\*\*$", lambda _: f"**{line}.**", section, count=1)
    if not marker or count != 1:
        raise SystemExit(f"{path} has no '## Op coverage' section with a **headline** line")
    _write_atomically(path, head + marker + new_section + sep + tail)


def _run(names: list[str], partial: Path, done: dict[str, dict[str, str]], options: dict[str, Any], jobs: int) -> None:
    """Run ``names``, appending each finished row to ``partial`` (flushed: a killed run loses only running ops)."""
    new_partial = not partial.exists()
    total = len(done) + len(names)
    with partial.open("a", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore", lineterminator="\n")
        if new_partial:
            writer.writeheader()

        def on_row(row: dict[str, str]) -> None:
            writer.writerow(row)
            f.flush()
            done[row["op"]] = row
            print(f"[{len(done)}/{total}] {row['op']}: {row['status']} {row['reason'][:100]}", flush=True)

        run_all(names, options, jobs, on_row)


def _command(args: argparse.Namespace) -> str:
    command = f"python benchmarks/opinfo_coverage.py --samples {args.samples} --dtype {args.dtype}"
    return command + (f" --ops '{args.ops}'" if args.ops else "") + (" --no-plain" if args.no_plain else "")


def main(argv: list[str] | None = None) -> int:
    """Run the selected ops (skipping those a partial run finished) and write the table."""
    args = parse_args(argv)
    out = args.out or ROOT / "docs" / ("op_coverage" if args.dtype == "float32" else f"op_coverage_{args.dtype}")
    table, partial = out.with_suffix(".csv"), Path(f"{out}.partial.csv")
    if args.fresh:
        partial.unlink(missing_ok=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    import opinfo_support as support

    names = [n for n in support.all_ops() if re.search(args.ops, n)]
    done = {op: row for op, row in read_rows(partial).items() if row.get("dtype") == args.dtype}
    todo = [] if args.render_only else [n for n in names if n not in done]
    print(f"{len(names)} ops selected, {len(done)} done by a partial run, {len(todo)} to run", flush=True)
    options = {"samples": args.samples, "dtype": args.dtype, "plain": not args.no_plain, "timeout": args.timeout,
               "ops_per_worker": args.ops_per_worker, "log": args.log}
    start = time.monotonic()
    if todo:
        _run(todo, partial, done, options, args.jobs)
    seconds = time.monotonic() - start
    merged = {} if args.fresh else {k: v for k, v in read_rows(table).items() if v.get("dtype") == args.dtype}
    merged.update(done)
    rows = [merged[n] for n in support.all_ops() if n in merged]
    _write_atomically(table, csv_text(rows))
    _write_atomically(out.with_suffix(".md"), markdown(rows, _command(args), args.dtype, args.samples))
    if args.update_readme:
        update_readme(ROOT / "README.md", headline(rows))
    if not args.render_only:
        partial.unlink(missing_ok=True)
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, all joined by now
    print(
        f"{headline(rows)}; {len(todo)} ops in {seconds / 60:.1f} min wall, {(cpu.ru_utime + cpu.ru_stime) / 60:.1f} "
        f"min CPU of the workers; wrote {table} and {out.with_suffix('.md')}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
