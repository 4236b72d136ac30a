"""``pipeline bench SPEC|model.ptrt``: latency percentiles and throughput, the converted module against PyTorch eager.

trtexec's first screen, for our modules: warm-up runs, then timed iterations of one call each, and the median,
p90, p99, mean and throughput (samples per second, from the batch size of the first input). With a model ``SPEC``
the model is converted first (the convert options apply) and PyTorch eager runs on the same inputs; an artifact has
no PyTorch model, so only the converted module is timed. ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from converters.errors import InputError
from converters.files import write_file_atomically
from pipeline.cli.common import add_conversion_arguments, conversion_options, model_and_sample, random_inputs


def add_bench_command(commands: Any) -> None:
    """Add the ``bench`` subcommand to ``pipeline``'s subparsers."""
    parser = commands.add_parser("bench", help="latency and throughput of the converted module vs PyTorch eager")
    parser.add_argument("target", help="file.py:factory (converted first) or a .ptrt artifact")
    parser.add_argument(
        "--input", action="append", default=[], metavar="NAME:SHAPE[:DTYPE]", help="inputs (random values)"
    )
    parser.add_argument("--dynamic", action="append", default=[], metavar="INPUT:AXIS:NAME:MIN:OPT:MAX")
    parser.add_argument("--backend", default="auto", help="backend to convert with (SPEC only)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls first (default 10)")
    parser.add_argument("--iterations", type=int, default=100, help="timed calls (default 100)")
    add_conversion_arguments(parser)  # SPEC only
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the figures as JSON")
    parser.set_defaults(run=_bench)


def time_calls(call: Callable[[], Any], warmup: int, iterations: int) -> list[float]:
    """Seconds of each of ``iterations`` calls, after ``warmup`` untimed ones."""
    with torch.inference_mode():
        for _ in range(warmup):
            call()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return times


def latency_figures(times: list[float], batch: int) -> dict[str, float]:
    """Median, p90, p99 and mean latency (ms) and throughput (samples/s) of per-call ``times`` in seconds."""
    ordered = sorted(times)

    def percentile(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1e3

    median = statistics.median(ordered)
    return {
        "median_ms": median * 1e3,
        "p90_ms": percentile(0.90),
        "p99_ms": percentile(0.99),
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "throughput_per_s": batch / median if median > 0 else float("inf"),
        "iterations": len(ordered),
    }


def _bench(args: argparse.Namespace) -> int:
    if args.warmup < 0 or args.iterations < 1:
        raise InputError("--warmup must be >= 0 and --iterations >= 1", fix="e.g. --warmup 10 --iterations 100")
    module, model, sample = _targets(args)
    call_args, call_kwargs = sample
    first = next(iter([*call_args, *call_kwargs.values()]), None)
    batch = int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1
    results: dict[str, Any] = {"target": args.target, "batch": batch, "warmup": args.warmup}
    results["converted"] = latency_figures(
        time_calls(lambda: module(*call_args, **call_kwargs), args.warmup, args.iterations), batch
    )
    results["converted"]["backend"] = getattr(module, "backend", "?")
    if model is not None:
        results["pytorch"] = latency_figures(
            time_calls(lambda: model(*call_args, **call_kwargs), args.warmup, args.iterations), batch
        )
        results["speedup_median"] = results["pytorch"]["median_ms"] / results["converted"]["median_ms"]
    print(_table(results))
    if args.json is not None:
        write_file_atomically(args.json, json.dumps(results, indent=2).encode())
    return 0


def _targets(args: argparse.Namespace) -> tuple[Any, torch.nn.Module | None, tuple[tuple[Any, ...], dict[str, Any]]]:
    import pipeline

    if args.target.endswith(".ptrt"):
        if not args.input:
            raise InputError(
                "an artifact holds no sample: say what to call it with",
                fix="pass --input NAME:SHAPE[:DTYPE] for each input (`pipeline inspect` lists them)",
            )
        return pipeline.load(Path(args.target)), None, ((), dict(random_inputs(args.input, args.seed)))
    model, sample = model_and_sample(args.target, args.input, args.seed)
    model = model.eval()
    module = pipeline.convert(model, sample, backend=args.backend, **conversion_options(args))
    from pipeline.module.io_spec import normalise_sample

    return module, model, normalise_sample(sample)


def _table(results: dict[str, Any]) -> str:
    rows = [("converted (" + str(results["converted"]["backend"]) + ")", results["converted"])]
    if "pytorch" in results:
        rows.append(("pytorch eager", results["pytorch"]))
    lines = [f"{'':24} {'median':>9} {'p90':>9} {'p99':>9} {'mean':>9} {'samples/s':>11}"]
    for name, r in rows:
        lines.append(
            f"{name:24} {r['median_ms']:8.3f}ms {r['p90_ms']:8.3f}ms {r['p99_ms']:8.3f}ms {r['mean_ms']:8.3f}ms "
            f"{r['throughput_per_s']:11.1f}"
        )
    lines.append(f"batch {results['batch']}, {results['converted']['iterations']} timed calls after "
                 f"{results['warmup']} warm-up calls")
    if "speedup_median" in results:
        lines.append(f"converted / eager: {results['speedup_median']:.2f}x faster (median)")
    return "\n".join(lines)
