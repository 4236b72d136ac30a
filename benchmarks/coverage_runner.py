"""The resumable runner of the coverage scripts (``model_coverage.py``, ``opinfo_coverage.py``): items (models, ops)
run in worker processes under a deadline, their rows appended to ``<out>.partial.csv`` as they come, and the table
(CSV and Markdown) written atomically at the end.

A worker runs the items it is sent one after another, ``per_worker`` of them before a fresh process takes over (1: a
process per item). An item past its deadline has its worker killed and is recorded by ``failed_row`` as ``timeout``;
a worker that dies records ``crash`` and is replaced, so nothing stops the run. A killed run resumes where it
stopped: the rows of the partial file count as done (a row cut short by the kill, lacking its ``required`` column,
does not).

>>> done = resume(partial, COLUMNS, key, "seconds", fresh=False)           # doctest: +SKIP
>>> record_rows(partial, COLUMNS, lambda write: run_all(todo, work, 2, write), progress)  # doctest: +SKIP
"""

from __future__ import annotations

import csv
import io
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Row = dict[str, str]
#: Workers that die before they are ready: the environment is broken, stop.
MAX_FAILED_STARTS = 3


@dataclass(frozen=True)
class Work:
    """What the workers do: ``setup()`` once per process (its imports), ``run(item)`` -> the item's row; each item
    within ``deadline`` seconds, else ``failed_row(item, status, reason, seconds)`` records it. ``setup`` and ``run``
    go to the worker processes: module-level functions (or partials of them)."""

    setup: Callable[[], None]
    run: Callable[[str], Row]
    deadline: float
    failed_row: Callable[[str, str, str, float], Row]
    crash: str = "crash: the worker process died (exit code {code}) while running the op"
    per_worker: int = 100
    log: str = os.devnull


def _worker(conn: Any, setup: Callable[[], None], run: Callable[[str], Row], log: str) -> None:
    """A worker process: run the items sent on ``conn`` and send back their rows, until it receives None."""
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)  # the exporter and TensorRT print: keep the parent's terminal for progress
    os.dup2(out, 2)
    # one thread per worker: the workers share the cores, and idle OpenMP threads spin on a busy machine
    os.environ["OMP_NUM_THREADS"] = "1"
    setup()
    conn.send("ready")
    while True:
        item = conn.recv()
        if item is None:
            return
        conn.send(run(item))


@dataclass
class _Process:
    """A worker process, its pipe, the item it runs and that item's deadline."""

    process: Any
    conn: Any
    ready: bool = False
    item: str | None = None
    started: float = 0.0
    done: int = 0
    deadline: float = 0.0


def _start(context: Any, work: Work) -> _Process:
    parent, child = context.Pipe()
    process = context.Process(target=_worker, args=(child, work.setup, work.run, work.log), daemon=True)
    process.start()
    child.close()
    return _Process(process, parent)


def _stop(worker: _Process) -> None:
    worker.process.kill()
    worker.process.join(10)
    worker.conn.close()


def run_all(items: list[str], work: Work, jobs: int, on_row: Callable[[Row], None]) -> None:
    """Run ``items`` on ``jobs`` workers, calling ``on_row(row)`` for each finished item (in finishing order)."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's thread pools
    pending = list(reversed(items))
    workers = [_start(context, work) for _ in range(min(jobs, len(items)))]
    failed_starts = 0
    while pending or any(w.item for w in workers):
        now = time.monotonic()
        for index, worker in enumerate(workers):
            if worker.item and now > worker.deadline:
                reason = f"timeout: killed after {work.deadline:g} s"
                on_row(work.failed_row(worker.item, "timeout", reason, now - worker.started))
                _stop(worker)
                workers[index] = worker = _start(context, work)
            if worker.ready and worker.item is None and pending:
                if worker.done >= work.per_worker:  # a fresh process now and then: leaks stay bounded
                    worker.conn.send(None)
                    worker.process.join(30)
                    workers[index] = worker = _start(context, work)
                    continue
                worker.item, worker.started = pending.pop(), now
                worker.deadline = now + work.deadline
                worker.conn.send(worker.item)
        live = [w.conn for w in workers if not w.conn.closed]
        for conn in multiprocessing.connection.wait(live, timeout=1.0):
            index = next(i for i, w in enumerate(workers) if w.conn is conn)
            worker = workers[index]
            try:
                message = worker.conn.recv()
            except (EOFError, OSError):  # the worker died: a crash of the item it was running (or of its start)
                code = worker.process.exitcode
                item = worker.item
                _stop(worker)
                workers[index] = _start(context, work)
                if item is None:
                    failed_starts += 1
                    if failed_starts > MAX_FAILED_STARTS:
                        raise RuntimeError(f"workers die before they are ready (exit code {code}): see --log") from None
                else:
                    reason = work.crash.format(code=code)
                    on_row(work.failed_row(item, "crash", reason, time.monotonic() - worker.started))
                continue
            if message == "ready":
                worker.ready, failed_starts = True, 0
                continue
            worker.item, worker.done = None, worker.done + 1
            on_row(message)
    for worker in workers:
        if worker.process.is_alive():
            worker.conn.send(None)
            worker.process.join(30)
        _stop(worker)


def read_rows(path: Path, key: Callable[[Row], str], required: str) -> dict[str, Row]:
    """The rows of a coverage CSV (or of a partial one) by ``key``; empty when it does not exist. A row without its
    ``required`` column was cut short by a kill: it does not count."""
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        return {key(row): row for row in csv.DictReader(f) if row.get(required)}


def csv_text(rows: Iterable[Row], columns: list[str]) -> str:
    """A coverage CSV: ``columns``, one line per row."""
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def write_atomically(path: Path, text: str) -> None:
    """``path`` holds the old text or the new, never a part (a killed run leaves the table as it was)."""
    from converters.files import write_file_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomically(path, text.encode())


def resume(partial: Path, columns: list[str], key: Callable[[Row], str], required: str, fresh: bool) -> dict[str, Row]:
    """The rows a killed run left in ``partial`` (none, ``fresh``: the file goes); a partial file of an older layout
    is rewritten in ``columns``."""
    if fresh:
        partial.unlink(missing_ok=True)
    done = read_rows(partial, key, required)
    if partial.exists() and partial.read_text().partition("\n")[0] != ",".join(columns):
        write_atomically(partial, csv_text(done.values(), columns))
    return done


def record_rows(
    partial: Path, columns: list[str], run: Callable[[Callable[[Row], None]], None], on_row: Callable[[Row], None]
) -> None:
    """``run(write)``, where ``write`` appends each row to ``partial`` (flushed: a killed run loses only the items
    running) and then calls ``on_row``."""
    new_partial = not partial.exists() or partial.stat().st_size == 0  # a run killed before its first row
    partial.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("a", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore", lineterminator="\n")
        if new_partial:
            writer.writeheader()
            f.flush()  # else a run killed before its first row leaves an empty file and the rows lose their header

        def write(row: Row) -> None:
            writer.writerow(row)
            f.flush()
            on_row(row)

        run(write)


def cell(text: str, limit: int) -> str:
    """``text`` as one Markdown table cell, cut at ``limit`` characters (brackets escaped: ``x['a']['b']`` in an
    error would read as a reference link)."""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]").replace("\n", " ") or " "
