"""Mutation testing of the newest modules (docs/mutation.md): mutmut changes one module's code one small edit at a time
(a ``<`` made ``<=``, a constant changed, a call dropped) and runs the fast tests that judge it; a mutant the tests
still pass on ("survived") is a gap in the tests, or an edit that changes nothing observable.

Each module runs in a scratch copy of the tree (``--work``, outside the repository): mutmut writes its mutated copies
under ``<work>/<module>/mutants/``, never into the working tree, and ``mutmut apply`` there cannot reach it. The
settings common to every module are pyproject.toml's ``[tool.mutmut]``; the runner fills in ``only_mutate`` (the
module) and ``pytest_add_cli_args_test_selection`` (its tests, from :data:`MODULES`). One mutmut process at a time,
one forked test run per mutant, niced.

Resumable like the coverage runs: a module already in the results JSON is skipped (``--fresh`` runs it again), and a
module killed midway resumes where mutmut stopped (its verdicts are kept in the scratch copy). The JSON is written
atomically after each module::

    python benchmarks/mutation_runner.py                                   # every module of MODULES not yet done
    python benchmarks/mutation_runner.py pipeline/runtime/generation/decoding.py --fresh
    python benchmarks/mutation_runner.py --recheck                         # the survivors again, after new tests
    python benchmarks/mutation_runner.py --table                           # the Markdown table of the results
    python benchmarks/mutation_runner.py --survivors                       # every mutant not killed, with its edit
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's converters (write_file_atomically)

RESULTS = ROOT / "benchmarks" / "results" / "mutation_newest.json"
#: module -> the fast test files (or node ids, or pytest's --deselect) that judge it; each runs in well under 15 s.
MODULES: dict[str, tuple[str, ...]] = {
    "pipeline/runtime/generation/decoding.py": (
        "tests/pipeline/generation/test_decoding.py",
        "tests/pipeline/generation/test_decoding_options.py",
    ),
    "pipeline/runtime/generation/slots.py": ("tests/pipeline/generation/test_request_slots.py",),
    "pipeline/runtime/generation/layout.py": ("tests/pipeline/generation/test_cache_layout.py",),
    "converters/generation_settings.py": ("tests/converters/test_generation_settings.py",),
    "converters/block_settings.py": ("tests/converters/test_block_settings.py",),
    # the anchor's end-to-end tests convert two models (12 s of fixtures per mutant): its tests without conversions
    "pipeline/accuracy/anchor.py": (
        "tests/pipeline/test_compare_anchor_runs.py",
        "tests/pipeline/test_compare_anchor.py::test_anchored_tolerance_is_the_factor_over_pytorch_error_and_never_below_"
        "the_fixed_one",
        "tests/pipeline/test_compare_anchor.py::test_pytorch_overflowing_its_own_half_type_is_said_not_hidden",
        "tests/pipeline/test_compare_anchor.py::test_precision_mode_computes_tensors_the_model_makes_itself_in_float64",
        "tests/pipeline/test_precision_guards.py::test_pytorchs_own_float16_keeps_the_guard_as_the_graph_does",
    ),
    "pipeline/runtime/segments/partition.py": (
        "tests/pipeline/backends/test_segments_partition.py",
        "tests/pipeline/backends/test_segments.py::test_partition_splits_around_an_excluded_node_without_a_cycle",
        "tests/pipeline/backends/test_segments.py::test_min_segment_size_sends_small_tensorrt_runs_to_onnx_runtime",
        "tests/pipeline/backends/test_segments.py::test_an_if_stays_whole_and_its_branches_outer_reads_are_segment_inputs",
    ),
    # the two-process lock test spawns interpreters (8 s): the lock is judged by the bound's tests of a held lock
    "pipeline/backends/tensorrt/engine_cache.py": (
        "tests/pipeline/test_engine_cache.py",
        "tests/pipeline/test_engine_cache_bound.py",
        "tests/pipeline/test_engine_cache_key.py",
        "tests/pipeline/test_engine_cache_reports.py",
        "--deselect",
        "tests/pipeline/test_engine_cache.py::test_two_processes_build_the_same_engine_once",
    ),
    # the quantize stage's own tests convert models (test_quantize_verdicts.py: 42 s): unit tests on small arrays
    "pipeline/quantize/awq.py": ("tests/pipeline/quantize/test_awq_units.py",),
    "passes/quantize/blockwise.py": ("tests/passes/test_blockwise_units.py",),
    "pipeline/quantize/four_bit.py": ("tests/pipeline/quantize/test_four_bit_units.py",),
}
#: What the tests of the scratch copy need of the tree (mutmut copies the packages and tests/ on into mutants/).
COPIED = ("pipeline", "converters", "passes", "tests", "examples", "pyproject.toml")
#: mutmut's verdicts (its exit codes, mutmut/stats.py) as counted here; any other code is "suspicious".
STATUS = {1: "killed", 3: "killed", 0: "survived", 33: "no tests", 5: "no tests", 34: "skipped", 36: "timeout"}
STATUS.update({-24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", 37: "killed"})


def slug(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def prepare(module: str, work: Path) -> None:
    """``work`` as a scratch tree for ``module``: the sources copied in (mtimes kept, so that mutmut re-mutates only
    what changed since its last run there) and pyproject.toml's ``[tool.mutmut]`` filled in for this module."""
    work.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        source, target = ROOT / name, work / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
            shutil.copytree(source, target, ignore=ignore, dirs_exist_ok=True, copy_function=shutil.copy2)
        else:
            shutil.copy2(source, target)
    text = (ROOT / "pyproject.toml").read_text()
    filled = {"only_mutate": [module], "pytest_add_cli_args_test_selection": list(MODULES[module])}
    for key, value in filled.items():
        text, count = re.subn(rf"(?m)^{key} = \[\]$", f"{key} = {json.dumps(value)}", text)
        if count != 1:
            raise SystemExit(f"pyproject.toml's [tool.mutmut] has no line `{key} = []` for the runner to fill in")
    (work / "pyproject.toml").write_text(text)


def uncommitted(module: str) -> bool:
    """Whether ``module`` differs from the last commit: its results judge a version nobody else has (and a mutant
    planted by hand in the working tree, then copied, would fail the clean run or skew the results)."""
    changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", module], cwd=ROOT, capture_output=True)
    return changed.returncode != 0


def run_mutmut(work: Path, log: Path, deadline: float, names: list[str]) -> int:
    """``mutmut run`` in ``work`` (of ``names`` only, when given: mutmut tests them again), one worker, niced; its
    output appended to ``log``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    mutmut = Path(sys.executable).with_name("mutmut")
    command = ["nice", "-n", "10", str(mutmut), "run", "--max-children", "1", *names]
    with log.open("a") as out:
        shown = " ".join(command[:7]) + (f" <{len(names)} mutants>" if names else "")
        out.write(f"\n=== {datetime.datetime.now().isoformat(timespec='seconds')} {shown} in {work}\n")
        out.flush()
        try:
            return subprocess.run(
                command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=deadline
            ).returncode
        except subprocess.TimeoutExpired:
            return -1


def verdicts(module: str, work: Path) -> dict[str, str]:
    """Each mutant of ``module`` and its verdict, from mutmut's record in ``work``."""
    meta = work / "mutants" / (module + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: "not checked" if code is None else STATUS.get(code, "suspicious") for name, code in codes.items()}


def diff(name: str, work: Path) -> str:
    """``mutmut show``: the mutant's edit as a unified diff of its function."""
    mutmut = Path(sys.executable).with_name("mutmut")
    shown = subprocess.run([str(mutmut), "show", name], cwd=work, capture_output=True, text=True, timeout=120)
    lines = shown.stdout.splitlines()
    return "\n".join(line for line in lines if line.startswith(("-", "+")) and not line.startswith(("---", "+++")))


def summary(module: str, found: dict[str, str], work: Path, seconds: float, dirty: bool) -> dict[str, Any]:
    """The results row of one module: the counts, the kill rate, and every mutant not killed with its diff."""
    counts = {status: sum(1 for s in found.values() if s == status) for status in sorted(set(found.values()))}
    judged = sum(counts.get(s, 0) for s in ("killed", "survived", "no tests", "timeout", "suspicious"))
    return {
        "module": module,
        "tests": list(MODULES[module]),
        "date": datetime.date.today().isoformat(),
        "seconds": round(seconds),
        "uncommitted_changes": dirty,
        "mutants": len(found),
        "counts": counts,
        # a timeout counts as killed (the mutant made the tests hang: they noticed), as mutmut's own score does
        "kill_rate": round((counts.get("killed", 0) + counts.get("timeout", 0)) / judged, 3) if judged else None,
        "not_killed": {
            n: {"status": s, "diff": diff(n, work)} for n, s in sorted(found.items()) if s not in ("killed", "timeout")
        },
    }


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def save(path: Path, results: dict[str, Any]) -> None:
    from converters.files import write_file_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomically(path, (json.dumps(results, indent=1, sort_keys=True) + "\n").encode())


def table(results: dict[str, Any]) -> str:
    """The Markdown table of docs/mutation.md."""
    lines = [
        "| module | mutants | killed | survived | no tests | timeouts | kill rate | date |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for module in sorted(results):
        row, c = results[module], results[module]["counts"]
        rate = "" if row["kill_rate"] is None else f"{100 * row['kill_rate']:.1f}%"
        lines.append(
            f"| `{module}` | {row['mutants']} | {c.get('killed', 0)} | {c.get('survived', 0)} | {c.get('no tests', 0)} "
            f"| {c.get('timeout', 0)} | {rate} | {row['date']} |"
        )
    return "\n".join(lines)


def survivors(results: dict[str, Any]) -> str:
    """The mutants the tests did not kill, per module, as Markdown rows ``| mutant | status | edit |`` (the edit: the
    changed lines of the diff), for docs/mutation.md's explanations."""
    lines = []
    for module in sorted(results):
        lines += [f"\n{module}\n", "| mutant | status | edit |", "|---|---|---|"]
        for name, row in sorted(results[module]["not_killed"].items()):
            edit = " → ".join(f"`{line[1:].strip()}`" for line in row["diff"].splitlines())
            lines.append(f"| `{name.rpartition('.')[2]}` | {row['status']} | {edit.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules of MODULES to run (default: all not yet done)")
    parser.add_argument("--fresh", action="store_true", help="run the modules again, from scratch")
    parser.add_argument(
        "--recheck", action="store_true", help="test the mutants a done module's tests did not kill again (new tests)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "torch-trt-pipeline-mutation")
    parser.add_argument("--deadline", type=float, default=7200.0, help="seconds one module may take")
    parser.add_argument("--table", action="store_true", help="print the Markdown table of --out and stop")
    parser.add_argument("--survivors", action="store_true", help="print the mutants not killed, per module, and stop")
    args = parser.parse_args(argv)
    results = load(args.out)
    if args.table or args.survivors:
        print(table(results) if args.table else survivors(results))
        return 0
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        parser.error(f"not in MODULES: {', '.join(unknown)} (known: {', '.join(MODULES)})")
    for module in args.modules or list(MODULES):
        work = args.work / slug(module)
        names: list[str] = []
        if module in results and not args.fresh:
            names = sorted(results[module]["not_killed"]) if args.recheck and (work / "mutants").exists() else []
            if not names:
                print(f"{module}: done ({results[module]['date']}), skipped", flush=True)
                continue
        if args.fresh and work.exists():
            shutil.rmtree(work)
        dirty = uncommitted(module)
        if dirty:
            print(f"{module}: WARNING: differs from the last commit; the results judge the working tree's version")
        prepare(module, work)
        started = time.monotonic() - (results[module]["seconds"] if names else 0)
        code = run_mutmut(work, args.work / f"{slug(module)}.log", args.deadline, names)
        found = verdicts(module, work)
        if code != 0 or not found or "not checked" in found.values():
            print(f"{module}: mutmut stopped (exit {code}), see {args.work / slug(module)}.log; run again to resume")
            continue
        results = load(args.out)  # another run may have written other modules meanwhile
        results[module] = summary(module, found, work, time.monotonic() - started, dirty)
        save(args.out, results)
        row = results[module]
        print(f"{module}: {row['mutants']} mutants, kill rate {row['kill_rate']}, {row['counts']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
