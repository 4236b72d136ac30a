"""Benchmark the ONNX Runtime path end to end on two transformers models built from configs (random weights).

1. Inference latency, interleaved round by round: PyTorch eager, the ``ConvertedModule`` and a bare
   ``onnxruntime.InferenceSession`` on the module's own final graph. The module's overhead over the bare
   session is reported three ways: the ratio of medians, the median of per-round (module - bare) differences,
   and the module's own Python work timed directly around a session that replays recorded outputs.
2. Convert time: ``pipeline.convert`` (validation on, default settings) against a plain
   ``torch.onnx.export(..., dynamo=True)`` of the same model, alternating, with the per-stage seconds.

Run from the repository root::

    python benchmarks/bench_convert.py                 # full run, a few minutes
    python benchmarks/bench_convert.py --quick         # smoke run
    python benchmarks/bench_convert.py --rounds 2000 --json results.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import itertools
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
import torch.utils._pytree as pytree
import transformers

import pipeline
from pipeline import ConvertedModule
from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

MODELS = ("resnet50", "bert6")
LATENCY_RUNNERS = ("torch", "module", "bare")
# "replay" is the module around a session that replays recorded outputs: its time is the module's own work.
TIMED_RUNNERS = (*LATENCY_RUNNERS, "replay")
# Targets the numbers are judged against (see the README next to this file).
MAX_OVERHEAD = 0.03
MAX_CONVERT_RATIO = 2.0


@dataclass(frozen=True)
class Case:
    """One model with the call it is benchmarked on."""

    name: str
    description: str
    model: torch.nn.Module
    args: tuple[torch.Tensor, ...]
    kwargs: dict[str, torch.Tensor]
    notes: tuple[str, ...] = ()

    @property
    def sample(self) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        return self.args, self.kwargs


@dataclass
class LatencyResult:
    samples_ms: dict[str, list[float]]
    paired_diff_ms: list[float]
    hot_overhead_us: float
    max_abs_module_vs_bare: float
    max_abs_module_vs_torch: float

    def median_ms(self, runner: str) -> float:
        return statistics.median(self.samples_ms[runner])

    @property
    def direct_overhead_us(self) -> float:
        """The module's own work timed as it really runs: once per round, with caches cold from the inference."""
        return self.median_ms("replay") * 1000

    @property
    def overhead_ratio(self) -> float:
        return self.median_ms("module") / self.median_ms("bare")

    @property
    def paired_overhead_ms(self) -> float:
        return statistics.median(self.paired_diff_ms)

    def ratio_interval(self, level: float = 0.95, resamples: int = 2000) -> tuple[float, float]:
        """Bootstrap interval of the module/bare ratio of medians, resampling whole rounds (so that pairs measured
        together stay together): when it straddles the target, the medians alone cannot tell."""
        rng = np.random.default_rng(0)
        module = np.asarray(self.samples_ms["module"])
        bare = np.asarray(self.samples_ms["bare"])
        picks = rng.integers(0, len(module), size=(resamples, len(module)))
        ratios = np.median(module[picks], axis=1) / np.median(bare[picks], axis=1)
        tail = (1 - level) / 2
        return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))

    @property
    def direct_overhead_fraction(self) -> float:
        return self.direct_overhead_us / 1000 / self.median_ms("bare")

    def verdict(self) -> str:
        """Judged on the ratio's interval; the direct figure (nearly noise-free) decides when the interval cannot,
        and an interval above the target that the direct figure contradicts is reported as unclear."""
        low, high = self.ratio_interval()
        if high <= 1 + MAX_OVERHEAD:
            return "ok"
        direct_ok = self.direct_overhead_fraction <= MAX_OVERHEAD
        if low > 1 + MAX_OVERHEAD:
            # The module's own work cannot explain a gap the direct figure does not show: the two sessions were
            # disturbed differently (a busy machine), so say so rather than pick one.
            return "UNCLEAR: CI over, direct ok" if direct_ok else "OVER TARGET"
        return "ok (direct)" if direct_ok else "OVER TARGET (direct)"

    def to_dict(self) -> dict[str, Any]:
        bare = self.median_ms("bare")
        return {
            "rounds": len(self.paired_diff_ms),
            "median_ms": {r: self.median_ms(r) for r in LATENCY_RUNNERS},
            "p10_ms": {r: _quantile(self.samples_ms[r], 0.1) for r in LATENCY_RUNNERS},
            "p90_ms": {r: _quantile(self.samples_ms[r], 0.9) for r in LATENCY_RUNNERS},
            "module_over_bare_ratio": self.overhead_ratio,
            "module_over_bare_percent": (self.overhead_ratio - 1) * 100,
            "module_over_bare_ratio_95ci": list(self.ratio_interval()),
            "paired_module_minus_bare_ms": self.paired_overhead_ms,
            "paired_module_minus_bare_percent": self.paired_overhead_ms / bare * 100,
            "direct_module_overhead_us": self.direct_overhead_us,
            "hot_loop_module_overhead_us": self.hot_overhead_us,
            "direct_module_overhead_percent": self.direct_overhead_fraction * 100,
            "verdict": self.verdict(),
            "max_abs_module_vs_bare": self.max_abs_module_vs_bare,
            "max_abs_module_vs_torch": self.max_abs_module_vs_torch,
        }


@dataclass
class ConvertResult:
    convert_s: list[float] = field(default_factory=list)
    export_s: list[float] = field(default_factory=list)
    # CPU seconds of the whole process (all threads): other processes on the machine barely move them, unlike the
    # wall clock, so their ratio is the steadier one on a busy machine.
    convert_cpu_s: list[float] = field(default_factory=list)
    export_cpu_s: list[float] = field(default_factory=list)
    stages_s: dict[str, list[float]] = field(default_factory=dict)
    summary: str = ""

    @property
    def ratio(self) -> float:
        return statistics.median(self.convert_s) / statistics.median(self.export_s)

    @property
    def min_ratio(self) -> float:
        """Other work only ever adds time, so the fastest repetition of each side is the least disturbed one."""
        return min(self.convert_s) / min(self.export_s)

    @property
    def cpu_ratio(self) -> float:
        return statistics.median(self.convert_cpu_s) / statistics.median(self.export_cpu_s)

    def stage_medians(self) -> dict[str, float]:
        return {name: statistics.median(values) for name, values in self.stages_s.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "repetitions": len(self.convert_s),
            "convert_s": self.convert_s,
            "export_s": self.export_s,
            "convert_median_s": statistics.median(self.convert_s),
            "export_median_s": statistics.median(self.export_s),
            "convert_over_export_ratio": self.ratio,
            "convert_cpu_s": self.convert_cpu_s,
            "export_cpu_s": self.export_cpu_s,
            "convert_over_export_cpu_ratio": self.cpu_ratio,
            "convert_over_export_min_ratio": self.min_ratio,
            "stage_median_s": self.stage_medians(),
            "report_summary": self.summary,
        }


# -- models --------------------------------------------------------------------------------------------------------


def resnet50_case() -> Case:
    # ResNetConfig's defaults are the ResNet-50 layout (bottleneck, depths 3-4-6-3).
    model = transformers.ResNetForImageClassification(transformers.ResNetConfig()).eval()
    return Case("resnet50", "ResNet-50, 1x3x224x224", model, (torch.randn(1, 3, 224, 224),), {})


def bert6_case() -> Case:
    config = transformers.BertConfig(
        num_hidden_layers=6, hidden_size=384, num_attention_heads=6, intermediate_size=1536
    )
    model = transformers.BertModel(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (1, 128))
    # A padded tail makes the mask do real work, as it would with a batch of real sentences.
    attention_mask = torch.ones(1, 128, dtype=torch.int64)
    attention_mask[:, 100:] = 0
    notes = (f"attention implementation: {model.config._attn_implementation}",)
    return Case(
        "bert6",
        "BERT 6 layers, hidden 384, 6 heads, seq 128, kwargs in / ModelOutput out",
        model,
        (),
        {"input_ids": input_ids, "attention_mask": attention_mask},
        notes,
    )


CASE_BUILDERS: dict[str, Callable[[], Case]] = {"resnet50": resnet50_case, "bert6": bert6_case}


# -- timing helpers ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """A collection in the middle of one timed call would land on whichever runner happened to be running."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The exporter prints progress and warns (missing torchvision, onnxscript folding); keep the table readable.

    Both sides of the convert comparison run inside it, so it costs them the same.
    """
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "pipeline")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed_with_cpu(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall and process CPU seconds of one call."""
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - start_cpu


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(values), q))


# Every order of the runners, cycled round by round. A plain rotation (t m b, m b t, b t m) is not enough: across
# its cycle "bare" follows an ORT session twice and "module" only once, so whoever inherits the other's
# still-spinning threads more often would look slower. All orders give each runner every predecessor alike.
ORDERS: tuple[tuple[str, ...], ...] = tuple(itertools.permutations(TIMED_RUNNERS))


# -- session options -----------------------------------------------------------------------------------------------


def session_options(threads: int) -> ort.SessionOptions:
    """The options ``OnnxRuntimeExecutor`` builds for ``ort_intra_op_threads=threads``: nothing else changed, so
    the bare session and the module's session differ only in who calls ``run``."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    return options


def convert_settings(threads: int) -> dict[str, Any]:
    # Default settings except the backend (named so that "auto" never probes for TensorRT) and the ORT thread
    # count, which only pins what ORT would otherwise pick by itself to the count torch uses.
    return {"backend": "onnxruntime", "ort_intra_op_threads": threads}


# -- 2. convert time -----------------------------------------------------------------------------------------------


def warm_up_toolchain(threads: int) -> None:
    """Pay the one-time costs (lazy imports, op registries, polygraphy) on a tiny model before any timing, so the
    first timed repetition of either side is not charged for them."""
    tiny = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    with quiet():
        pipeline.convert(tiny, x, **convert_settings(threads))
        torch.onnx.export(tiny, (x,), dynamo=True)


def measure_convert(case: Case, repetitions: int, threads: int) -> tuple[ConvertResult, ConvertedModule]:
    result = ConvertResult()
    module: ConvertedModule | None = None

    def run_convert() -> None:
        nonlocal module
        module = pipeline.convert(case.model, case.sample, **convert_settings(threads))

    def run_export() -> None:
        torch.onnx.export(case.model, case.args, kwargs=case.kwargs, dynamo=True)

    # One untimed conversion of this very model first: the exporter translates and compiles each op's ONNX
    # function on first use and the model's first eager call sets up its kernels, costs that would otherwise all
    # land on whichever side goes first in the first repetition.
    with quiet():
        run_convert()
    for rep in range(repetitions):
        # Alternate which side goes first so neither always inherits the other's warm caches or leftover heat.
        order = (("convert", run_convert), ("export", run_export))
        for side, fn in order if rep % 2 == 0 else order[::-1]:
            gc.collect()
            with quiet():
                seconds, cpu_seconds = timed_with_cpu(fn)
            (result.convert_s if side == "convert" else result.export_s).append(seconds)
            (result.convert_cpu_s if side == "convert" else result.export_cpu_s).append(cpu_seconds)
            print(
                f"  [{case.name}] rep {rep + 1}/{repetitions} {side:<7} {seconds:6.2f} s wall {cpu_seconds:6.2f} s cpu",
                flush=True,
            )
            if side == "convert":
                assert module is not None
                for name, stage_seconds in module.report.stages:
                    result.stages_s.setdefault(name, []).append(stage_seconds)
    assert module is not None
    result.summary = module.report.summary()
    return result, module


# -- 1. latency ----------------------------------------------------------------------------------------------------


class ReplaySession:
    """Stands in for the ORT session and returns outputs recorded once: timing the module around it leaves only
    the module's own Python work (input flattening and checks, numpy conversion, output rebuilding)."""

    def __init__(self, outputs: list[np.ndarray]) -> None:
        self._outputs = outputs

    def run(self, output_names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self._outputs


def replay_module(module: ConvertedModule, outputs: list[np.ndarray]) -> ConvertedModule:
    """A copy of ``module`` whose session replays ``outputs``; the module under test is untouched."""
    original = module._executor
    if not isinstance(original, OnnxRuntimeExecutor):
        raise TypeError(f"the direct measurement needs the onnxruntime backend, not {original.backend}")
    executor = copy.copy(original)
    executor.session = ReplaySession(outputs)
    return ConvertedModule(executor, module.io, module.onnx, module.settings, module.report)


def hot_overhead_us(case: Case, replay: ConvertedModule, calls: int) -> float:
    """Median microseconds of the module's own work per call in a tight loop (caches hot), timed in blocks so the
    clock's resolution stays far below what is measured. A lower bound: between real inferences the same work
    runs with cold caches and takes several times longer, which is what the interleaved "replay" runner times."""
    block = 50
    per_call: list[float] = []
    with no_gc():
        for _ in range(max(1, calls // block)):
            start = time.perf_counter()
            for _ in range(block):
                replay(*case.args, **case.kwargs)
            per_call.append((time.perf_counter() - start) / block)
    return statistics.median(per_call) * 1e6


def _flat_outputs(result: Any) -> list[np.ndarray]:
    leaves = pytree.tree_leaves(result)
    return [leaf.detach().numpy() for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _max_abs(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    if len(a) != len(b):
        raise AssertionError(f"{len(a)} outputs against {len(b)}")
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in zip(a, b, strict=True))


def measure_latency(
    case: Case, module: ConvertedModule, rounds: int, warmup: int, threads: int, gap_s: float, budget_s: float
) -> LatencyResult:
    session = ort.InferenceSession(
        module.onnx.SerializeToString(), sess_options=session_options(threads), providers=["CPUExecutionProvider"]
    )
    graph_inputs = module.io.flatten_call(case.args, case.kwargs)  # graph order, as the module feeds them
    feed = {spec.name: t.numpy() for spec, t in zip(module.io.inputs, graph_inputs, strict=True)}
    output_names = [spec.name for spec in module.io.outputs]

    def run_torch() -> Any:
        with torch.inference_mode():
            return case.model(*case.args, **case.kwargs)

    def run_module() -> Any:
        return module(*case.args, **case.kwargs)

    def run_bare() -> Any:
        return session.run(output_names, feed)

    bare_outputs = [np.asarray(o) for o in run_bare()]
    module_outputs = _flat_outputs(run_module())
    torch_outputs = _flat_outputs(run_torch())
    replay = replay_module(module, bare_outputs)

    def run_replay() -> Any:
        return replay(*case.args, **case.kwargs)

    runners = {"torch": run_torch, "module": run_module, "bare": run_bare, "replay": run_replay}
    samples: dict[str, list[float]] = {name: [] for name in TIMED_RUNNERS}
    diffs: list[float] = []
    # On a busy shared machine a round can take many times its quiet duration; the budget keeps the whole run
    # bounded, and the table shows how many rounds were actually measured.
    deadline = time.perf_counter() + budget_s
    with no_gc():
        for r in range(warmup + rounds):
            if r > warmup and time.perf_counter() > deadline:
                break
            this_round: dict[str, float] = {}
            for name in ORDERS[r % len(ORDERS)]:
                # ORT's intra-op workers (and torch's OpenMP threads) spin for a while after a call returns; on a
                # 2-core machine they would steal the CPU from whichever runner comes next. The pause lets them
                # park, so each call is timed as it would run alone.
                time.sleep(gap_s)
                this_round[name] = timed(runners[name]) * 1e3
            if r < warmup:
                continue
            for name, ms in this_round.items():
                samples[name].append(ms)
            diffs.append(this_round["module"] - this_round["bare"])
    return LatencyResult(
        samples_ms=samples,
        paired_diff_ms=diffs,
        hot_overhead_us=hot_overhead_us(case, replay, calls=max(500, rounds * 5)),
        max_abs_module_vs_bare=_max_abs(module_outputs, bare_outputs),
        max_abs_module_vs_torch=_max_abs(module_outputs, torch_outputs),
    )


# -- report --------------------------------------------------------------------------------------------------------


def _pct(fraction: float) -> str:
    return f"{fraction * 100:+.2f}%"


def format_table(cases: list[Case], latency: dict[str, LatencyResult], conversion: dict[str, ConvertResult]) -> str:
    lines = ["", "=" * 110, "Inference latency (median ms over interleaved rounds)", "-" * 110]
    lines.append(
        f"{'model':<10} {'rounds':>6} {'torch eager':>12} {'module':>9} {'bare ORT':>9} {'module/bare':>12} "
        f"{'95% CI':>17} {'paired':>8} {'direct':>15} {'hot':>6}  verdict"
    )
    for case in cases:
        lat = latency[case.name]
        bare = lat.median_ms("bare")
        low, high = lat.ratio_interval()
        lines.append(
            f"{case.name:<10} {len(lat.paired_diff_ms):>6} {lat.median_ms('torch'):>12.3f} "
            f"{lat.median_ms('module'):>9.3f} {bare:>9.3f} {_pct(lat.overhead_ratio - 1):>12} "
            f"{_pct(low - 1):>8}..{_pct(high - 1):<7} {_pct(lat.paired_overhead_ms / bare):>8} "
            f"{lat.direct_overhead_us:>5.0f} us {_pct(lat.direct_overhead_fraction):>6} "
            f"{lat.hot_overhead_us:>3.0f} us  {lat.verdict()}"
        )
    lines += [
        "  module/bare: ratio of the medians, as overhead (95% CI: bootstrap over rounds); paired: median of",
        "  (module - bare) within a round, over the bare median; direct: the module's own Python work per call,",
        "  timed in the rounds with the session replaced by one that replays recorded outputs, and its share of the",
        "  bare median; hot: the same work in a tight loop (caches hot, a lower bound).",
        f"  target: overhead <= {MAX_OVERHEAD:.0%}; '(direct)' marks a verdict the CI could not give alone.",
    ]
    for case in cases:
        lat = latency[case.name]
        lines.append(
            f"  {case.name}: torch eager / bare ORT = {lat.median_ms('torch') / lat.median_ms('bare'):.2f}x; "
            f"max |module - bare| = {lat.max_abs_module_vs_bare:.1e}, "
            f"max |module - torch| = {lat.max_abs_module_vs_torch:.1e}"
        )

    lines += ["", "Convert time (median seconds)", "-" * 110]
    stage_names = list(dict.fromkeys(n for c in cases for n in conversion[c.name].stages_s))
    stage_header = " ".join(f"{n:>9}" for n in stage_names)
    lines.append(
        f"{'model':<10} {'reps':>4} {'convert':>8} {'export':>7} {'ratio':>6} {'min':>6} {'cpu':>6}  {stage_header}  "
        "verdict"
    )
    for case in cases:
        conv = conversion[case.name]
        stages = conv.stage_medians()
        stage_cells = " ".join(f"{stages.get(n, float('nan')):>9.2f}" for n in stage_names)
        lines.append(
            f"{case.name:<10} {len(conv.convert_s):>4} {statistics.median(conv.convert_s):>8.2f} "
            f"{statistics.median(conv.export_s):>7.2f} {conv.ratio:>5.2f}x {conv.min_ratio:>5.2f}x "
            f"{conv.cpu_ratio:>5.2f}x  {stage_cells}  "
            f"{'ok' if conv.ratio <= MAX_CONVERT_RATIO else 'OVER TARGET'}"
        )
    lines.append(
        "  convert: pipeline.convert with validation; export: torch.onnx.export(dynamo=True) alone; "
        f"target ratio <= {MAX_CONVERT_RATIO:g}x (wall);"
    )
    lines.append(
        "  ratio: of the medians; min: of the fastest repetitions (the least disturbed by other work); cpu: of the "
        "median process CPU seconds"
    )
    lines.append(
        "  stages: median seconds of each stage of convert; 'export' and 'validate' run the model in PyTorch, which "
        "a busy machine slows most"
    )
    lines.append("=" * 110)
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="latency rounds per model (default 1000, quick 40)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default 30, quick 5)")
    parser.add_argument("--convert-reps", type=int, default=None, help="convert/export repetitions (default 3)")
    parser.add_argument(
        "--gap-ms", type=float, default=20.0, help="idle ms before each timed call, for spinning threads to park"
    )
    parser.add_argument(
        "--budget-s", type=float, default=240.0, help="stop a model's latency rounds early after this many seconds"
    )
    parser.add_argument("--threads", type=int, default=2, help="threads for torch and for ONNX Runtime (default 2)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--quick", action="store_true", help="a short smoke run: few rounds, one repetition")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    args.rounds = args.rounds if args.rounds is not None else (40 if args.quick else 1000)
    args.warmup = args.warmup if args.warmup is not None else (5 if args.quick else 30)
    args.convert_reps = args.convert_reps if args.convert_reps is not None else (1 if args.quick else 3)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if args.rounds < 1 or args.convert_reps < 1 or args.threads < 1:
        parser.error("--rounds, --convert-reps and --threads must be at least 1")
    return args


def _load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def environment(threads: int) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "transformers": transformers.__version__,
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # One thread count for both engines: torch eager defaults to every core and ORT to every physical core, so on
    # a shared machine they could silently differ and the latency comparison would measure the thread count, not
    # the engine. Fixed here and passed to ORT as intra_op_num_threads for both the module and the bare session.
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    started = time.perf_counter()
    load_start = _load_average()
    print(
        f"threads={args.threads} rounds={args.rounds} warmup={args.warmup} convert_reps={args.convert_reps} "
        f"gap={args.gap_ms:g} ms; load average {load_start}"
    )
    warm_up_toolchain(args.threads)

    cases: list[Case] = []
    latency: dict[str, LatencyResult] = {}
    conversion: dict[str, ConvertResult] = {}
    for name in args.models:
        case = CASE_BUILDERS[name]()
        cases.append(case)
        print(f"\n{case.name}: {case.description}", *(f"  note: {n}" for n in case.notes), sep="\n", flush=True)
        conversion[name], module = measure_convert(case, args.convert_reps, args.threads)
        print(f"  latency: {args.warmup} warm-up + {args.rounds} rounds (at most {args.budget_s:g} s) ...", flush=True)
        latency[name] = measure_latency(
            case, module, args.rounds, args.warmup, args.threads, args.gap_ms / 1e3, args.budget_s
        )
        del module
        gc.collect()

    for case in cases:
        print(f"\n{case.name} conversion report (last repetition):\n{conversion[case.name].summary}")
    print(format_table(cases, latency, conversion))
    elapsed = time.perf_counter() - started
    load_end = _load_average()
    # Other work shares the machine; the load average says how much the numbers above may have been disturbed.
    print(f"total {elapsed:.0f} s; 1/5/15-min load average at start {load_start}, at end {load_end}")

    if args.json is not None:
        results = {
            "environment": environment(args.threads),
            "settings": {
                "rounds": args.rounds,
                "warmup": args.warmup,
                "convert_reps": args.convert_reps,
                "gap_ms": args.gap_ms,
                "budget_s": args.budget_s,
            },
            "load_average": {"start": load_start, "end": load_end},
            "targets": {"max_overhead": MAX_OVERHEAD, "max_convert_ratio": MAX_CONVERT_RATIO},
            "models": {
                c.name: {
                    "description": c.description,
                    "notes": list(c.notes),
                    "latency": latency[c.name].to_dict(),
                    "convert": conversion[c.name].to_dict(),
                }
                for c in cases
            },
            "total_seconds": elapsed,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
