"""``pipeline bench SPEC|model.ptrt``: latency percentiles and throughput, the converted module against PyTorch eager.

trtexec's first screen, for our modules: warm-up runs, then timed iterations of one call each, and the median,
p90, p99, mean and throughput (samples per second, from the batch size of the first input). With a model ``SPEC``
the model is converted first (the convert options apply) and PyTorch eager runs on the same inputs; an artifact has
no PyTorch model, so only the converted module is timed. ``--json`` writes the figures.

A fair comparison on a CPU: both sides get the same number of threads (``--threads``, default PyTorch's own,
``torch.get_num_threads()``), ONNX Runtime's intra-op threads do not spin-wait between calls (by default they do,
and on a busy machine the spinning threads take the cores eager PyTorch needs: ``--ort-spinning`` turns it back
on), and the two are timed interleaved (each iteration calls both, alternating which goes first), so a change in
the machine's load falls on both. The JSON says which thread settings were used, with the machine's load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import InputError
from converters.files import write_file_atomically
from pipeline.cli.bench_generate import add_generation_bench_arguments, bench_generation, generation_table
from pipeline.cli.common import add_conversion_arguments, conversion_options, model_and_sample, random_inputs

if TYPE_CHECKING:
    import torch


def add_bench_command(commands: Any) -> None:
    """Add the ``bench`` subcommand to ``pipeline``'s subparsers."""
    parser = commands.add_parser("bench", help="latency and throughput of the converted module vs PyTorch eager")
    parser.add_argument("target", help="file.py:factory (converted first) or a .ptrt artifact")
    parser.add_argument(
        "--input", action="append", default=[], metavar="NAME:SHAPE[:DTYPE]", help="inputs (random values)"
    )
    parser.add_argument("--dynamic", action="append", default=[], metavar="INPUT:AXIS:NAME:MIN:OPT:MAX")
    parser.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "onnxruntime", "tensorrt", "tensorrt-rtx"],
        help="backend to convert with (SPEC only); a TensorRT-RTX engine that cannot run here is not timed (the "
        "table says what was)",
    )
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 10; --generate: 1 run)")
    parser.add_argument(
        "--iterations", type=int, default=None, help="timed calls (default 100; --generate: 5 whole generations)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads of PyTorch and ONNX Runtime alike (default: PyTorch's)"
    )
    parser.add_argument(
        "--ort-spinning", action="store_true", help="let ONNX Runtime's threads spin-wait between calls (its default)"
    )
    add_conversion_arguments(parser)  # SPEC only
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the figures as JSON")
    add_generation_bench_arguments(parser)
    parser.set_defaults(run=_bench)


def time_calls(call: Callable[[], Any], warmup: int, iterations: int) -> list[float]:
    """Seconds of each of ``iterations`` calls, after ``warmup`` untimed ones."""
    import torch

    with torch.inference_mode():
        for _ in range(warmup):
            call()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return times


def time_interleaved(calls: Mapping[str, Callable[[], Any]], warmup: int, iterations: int) -> dict[str, list[float]]:
    """Seconds of each call of each of ``calls`` over ``iterations`` rounds, after ``warmup`` untimed rounds; every
    round calls each once, first to last on even rounds and last to first on odd ones."""
    import torch

    named = list(calls.items())
    times: dict[str, list[float]] = {name: [] for name, _ in named}
    with torch.inference_mode():
        for _ in range(warmup):
            for _, call in named:
                call()
        for round_ in range(iterations):
            for name, call in named if round_ % 2 == 0 else named[::-1]:
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
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
    import torch

    if (args.warmup is not None and args.warmup < 0) or (args.iterations is not None and args.iterations < 1):
        raise InputError("--warmup must be >= 0 and --iterations >= 1", fix="e.g. --warmup 10 --iterations 100")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads {args.threads} is not a thread count", fix="e.g. --threads 4, or leave it out")
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    ort_threads = {"ort_intra_op_threads": threads, "ort_allow_spinning": bool(args.ort_spinning)}
    if args.generate:
        return _bench_generation(args, ort_threads, threads)
    args.warmup = 10 if args.warmup is None else args.warmup
    args.iterations = 100 if args.iterations is None else args.iterations
    module, model, sample = _targets(args, ort_threads)
    call_args, call_kwargs = sample
    first = next(iter([*call_args, *call_kwargs.values()]), None)
    batch = int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1
    results: dict[str, Any] = {"target": args.target, "batch": batch, "warmup": args.warmup}
    calls = {"converted": lambda: module(*call_args, **call_kwargs)}
    if model is not None:
        calls["pytorch"] = lambda: model(*call_args, **call_kwargs)
    for name, times in time_interleaved(calls, args.warmup, args.iterations).items():
        results[name] = latency_figures(times, batch)
    results["converted"]["backend"] = getattr(module, "backend", "?")
    results["converted"]["runs_on"] = runs_on(module)
    if model is not None:
        results["speedup_median"] = results["pytorch"]["median_ms"] / results["converted"]["median_ms"]
    results["threads"] = _thread_settings(module, threads)
    print(_table(results))
    if args.json is not None:
        write_file_atomically(args.json, json.dumps(results, indent=2).encode())
    return 0


def _bench_generation(args: argparse.Namespace, ort_threads: dict[str, Any], threads: int) -> int:
    """``--generate``: prefill and decode tokens/s of a generation artifact (:mod:`pipeline.cli.bench_generate`)."""
    from pipeline.cli.generate import load_generative

    if not args.target.endswith(".ptrt") or args.input:
        raise InputError(
            f"--generate times a generation artifact; got {args.target}" + (" with --input" if args.input else ""),
            fix="convert first: pipeline convert SPEC --generation max_length=256,max_batch=4 -o OUT; then "
            "pipeline bench OUT/model.ptrt --generate (prompts are drawn: --batch, --prompt-length, --new-tokens)",
        )
    module = _with_threads(load_generative(Path(args.target)), ort_threads)
    results = bench_generation(args, module)
    results["backend"], results["runs_on"] = module.backend, runs_on(module)
    results["threads"] = _thread_settings(module, threads)
    results["threads"]["timing"] = "whole generations, one after another; prefill = time to the first new token"
    print(generation_table(backend_label(results), results))
    print(_threads_line(results["threads"]))
    if args.json is not None:
        write_file_atomically(args.json, json.dumps(results, indent=2).encode())
    return 0


def runs_on(module: Any) -> str:
    """What the module's calls run on: its backend, or ``onnxruntime`` for a TensorRT-RTX engine that cannot run
    here (the module runs the same graph on ONNX Runtime, and that is what was timed)."""
    return str(getattr(module, "runs_on", getattr(module, "backend", "?")))


def backend_label(converted: dict[str, Any]) -> str:
    """The table's name for the converted module's row: the backend, and what was timed when it is not that."""
    backend, ran = converted["backend"], converted.get("runs_on", converted["backend"])
    return f"converted ({backend})" if ran == backend else f"converted ({backend} engine not run: {ran} timed)"


def _thread_settings(module: Any, threads: int) -> dict[str, Any]:
    """What the figures were measured with: both sides' threads, ONNX Runtime's spinning, the machine's load."""
    import torch

    on_ort = runs_on(module) == "onnxruntime"
    settings = getattr(module, "settings", None)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "torch_intra_op": torch.get_num_threads(),
        "torch_inter_op": torch.get_num_interop_threads(),
        "onnxruntime_intra_op": settings.ort_intra_op_threads if on_ort and settings else None,
        "onnxruntime_allow_spinning": settings.ort_allow_spinning if on_ort and settings else None,
        "requested": threads,
        "cpu_count": os.cpu_count(),
        "load_average_1min": load,
        "busy": load is not None and load > (os.cpu_count() or 1),
        "timing": "interleaved: each iteration calls every side once, alternating which goes first",
    }


def _targets(
    args: argparse.Namespace, ort_threads: dict[str, Any]
) -> tuple[Any, torch.nn.Module | None, tuple[tuple[Any, ...], dict[str, Any]]]:
    import pipeline

    if args.target.endswith(".ptrt"):
        if not args.input:
            raise InputError(
                "an artifact holds no sample: say what to call it with",
                fix="pass --input NAME:SHAPE[:DTYPE] for each input (`pipeline inspect` lists them)",
            )
        module = _with_threads(pipeline.load(Path(args.target)), ort_threads)
        return module, None, ((), dict(random_inputs(args.input, args.seed)))
    model, sample = model_and_sample(args.target, args.input, args.seed)
    model = model.eval()
    module = pipeline.convert(model, sample, backend=args.backend, **conversion_options(args), **ort_threads)
    from pipeline.runtime.io_spec import normalise_sample

    return module, model, normalise_sample(sample)


def _with_threads(loaded: Any, ort_threads: dict[str, Any]) -> Any:
    """An artifact's module on ONNX Runtime, its session remade with the bench's thread settings (the artifact's
    own are whatever its conversion had); a TensorRT module as loaded."""
    if loaded.backend != "onnxruntime":
        return loaded
    from pipeline.runtime.generation.module import module_class
    from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

    settings = dataclasses.replace(loaded.settings, **ort_threads)
    executor = OnnxRuntimeExecutor(loaded.onnx, loaded.io, settings)
    module = module_class(settings)(executor, loaded.io, loaded.onnx, settings, loaded.report)
    module.loaded = loaded  # a submodule: its external weights, if any, live as long as the new module
    return module


def _table(results: dict[str, Any]) -> str:
    rows = [(backend_label(results["converted"]), results["converted"])]
    if "pytorch" in results:
        rows.append(("pytorch eager", results["pytorch"]))
    width = max(24, *(len(name) for name, _ in rows))
    lines = [f"{'':{width}} {'median':>9} {'p90':>9} {'p99':>9} {'mean':>9} {'samples/s':>11}"]
    for name, r in rows:
        lines.append(
            f"{name:{width}} {r['median_ms']:8.3f}ms {r['p90_ms']:8.3f}ms {r['p99_ms']:8.3f}ms {r['mean_ms']:8.3f}ms "
            f"{r['throughput_per_s']:11.1f}"
        )
    lines.append(
        f"batch {results['batch']}, {results['converted']['iterations']} timed calls after "
        f"{results['warmup']} warm-up calls, interleaved"
    )
    lines.append(_threads_line(results["threads"]))
    if "speedup_median" in results:
        lines.append(f"converted / eager: {results['speedup_median']:.2f}x faster (median)")
    return "\n".join(lines)


def _threads_line(t: dict[str, Any]) -> str:
    ort = ""
    if t["onnxruntime_intra_op"] is not None:
        spinning = "on" if t["onnxruntime_allow_spinning"] else "off"
        ort = f", onnxruntime intra-op {t['onnxruntime_intra_op']} (spinning {spinning})"
    load = f", load {t['load_average_1min']:.1f}" if t["load_average_1min"] is not None else ""
    line = f"threads: torch {t['torch_intra_op']}{ort}; {t['cpu_count']} CPUs{load}"
    if t["busy"]:
        line += (
            "\nnote: the machine is busy (more runnable threads than CPUs): every figure is unreliable, multi-threaded "
            "ones most (threads wait for each other at every op); --threads 1 suffers least"
        )
    return line
