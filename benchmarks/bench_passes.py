"""Benchmark the default pass list against ``onnxslim.slim`` on the same graphs: time, peak memory, nodes left.

Graphs: synthetic chains and wider DAGs of cheap elementwise ops of 10k, 20k and 80k nodes, with foldable constant
subgraphs, static shape arithmetic, Identity nodes and dead branches; and transformers models built from configs with
random weights, exported with ``pipeline.exporting.stage``. Our side is ``pipeline.conversion.run_passes`` with default
settings (``to_graph``, the default pass list under ``PassManager``, ``to_model``, the ONNX check); onnxslim's is
``onnxslim.slim(model)`` with its defaults. Every measurement runs in a fresh subprocess that loads the model first,
so both tools are measured alike; runs of the two alternate. See benchmarks/README.md (``bench_passes.py``).

onnxslim is not a dependency of this project: ``pip install onnxslim`` (it does not pull torch). Without it the
benchmark measures our pass list alone and says so.

Run from the repository root::

    python benchmarks/bench_passes.py              # full run, about 8 minutes on 2 cores at load ~2.5
    python benchmarks/bench_passes.py --quick      # 10k-node graphs and one small model, one run each
    python benchmarks/bench_passes.py --families chain --sizes 20000 --runs 5 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FAMILIES = ("chain", "dag")
SIZES = (10_000, 20_000, 80_000)
MODELS = ("bert_tiny", "bert_small", "vit_tiny", "bert_tiny_dynamic")
TOOLS = ("ours", "onnxslim")
# Targets from issue 4 (see the README next to this file).
MAX_TIME_RATIO = 0.2
MAX_PER_NODE_GROWTH = 1.25  # time per node at the largest size over the smallest: "flat" within the machine's noise
LARGE_GRAPH = 50_000  # onnxslim takes minutes on these: --large-runs measurements, not --runs
RESULT_PREFIX = "RESULT "


# -- synthetic graphs ----------------------------------------------------------------------------------------------


def chain_graph(nodes: int) -> onnx.ModelProto:
    """Blocks of 15 nodes on a [4, 16] tensor; 5 of them are left by a complete cleanup and fold.

    Per block: a Reshape to the transposed shape computed from ``Shape`` (Gather, Gather, Concat: folded from the
    static shape), a constant subgraph (``Constant`` node, Add, Mul: folded), Add, an Identity, Tanh, a dead
    Sigmoid -> Exp branch, Mul by a shared scalar and Relu. The last Relu writes the graph output.
    """
    out, inits, y = [], [_init("scale", np.array(0.5, np.float32))], "x"
    inits += [_init("idx0", np.array([0], np.int64)), _init("idx1", np.array([1], np.int64))]
    blocks = max(1, nodes // 15)
    for b in range(blocks):
        p = f"b{b}/"
        inits += [_init(p + "a", np.full((1,), 0.01 * (b % 7), np.float32))]
        inits += [_init(p + "m", np.full((1,), 1.0 + 0.001 * (b % 5), np.float32))]
        constant = numpy_helper.from_array(np.array([0.1], np.float32))
        out += [
            _node("Shape", [y], p + "shape"),
            _node("Gather", [p + "shape", "idx0"], p + "d0", axis=0),
            _node("Gather", [p + "shape", "idx1"], p + "d1", axis=0),
            _node("Concat", [p + "d1", p + "d0"], p + "newshape", axis=0),
            _node("Reshape", [y, p + "newshape"], p + "r"),
            _node("Constant", [], p + "c", value=constant),
            _node("Add", [p + "c", p + "a"], p + "ca"),
            _node("Mul", [p + "ca", p + "m"], p + "k"),
            _node("Add", [p + "r", p + "k"], p + "s"),
            _node("Identity", [p + "s"], p + "i"),
            _node("Tanh", [p + "i"], p + "t"),
            _node("Sigmoid", [p + "t"], p + "dead0"),
            _node("Exp", [p + "dead0"], p + "dead1"),
            _node("Mul", [p + "t", "scale"], p + "u"),
            _node("Relu", [p + "u"], p + "y"),
        ]
        y = p + "y"
    out[-1].output[0] = "out"
    shape = [16, 4] if blocks % 2 else [4, 16]
    return _model("chain", out, inits, [4, 16], shape)


def dag_graph(nodes: int, width: int = 8) -> onnx.ModelProto:
    """Layers of 26 nodes over 8 lanes of [4, 16]; 18 of them are left by a complete cleanup and fold.

    Per layer: lane i becomes Tanh(lane i + lane i+1) for every lane, then lane 0 is multiplied by a folded
    constant subgraph (``Constant``, Add, Mul), lane 1 passes an Identity, lane 2 feeds a dead Sigmoid -> Exp branch
    and lane 3 gets Expand(0.5, Shape(lane 3)) added (folded from the static shape). A Sum of the lanes is the output.
    The lanes start as x scaled by distinct constants, so no two nodes compute the same thing.
    """
    out, inits, lanes = [], [_init("half", np.array(0.5, np.float32))], []
    for i in range(width):
        inits.append(_init(f"lane{i}/scale", np.array(1.1 + 0.1 * i, np.float32)))
        out.append(_node("Mul", ["x", f"lane{i}/scale"], f"lane{i}/x"))
        lanes.append(f"lane{i}/x")
    for layer in range(max(1, (nodes - width - 1) // (2 * width + 10))):
        p = f"l{layer}/"
        inits += [_init(p + "a", np.full((1,), 0.01 * (layer % 7), np.float32))]
        inits += [_init(p + "m", np.full((1,), 1.0 + 0.001 * (layer % 5), np.float32))]
        new = []
        for i in range(width):
            out.append(_node("Add", [lanes[i], lanes[(i + 1) % width]], p + f"s{i}"))
            out.append(_node("Tanh", [p + f"s{i}"], p + f"t{i}"))
            new.append(p + f"t{i}")
        constant = numpy_helper.from_array(np.array([0.1], np.float32))
        out += [
            _node("Constant", [], p + "c", value=constant),
            _node("Add", [p + "c", p + "a"], p + "ca"),
            _node("Mul", [p + "ca", p + "m"], p + "k"),
            _node("Mul", [new[0], p + "k"], p + "lane0"),
            _node("Identity", [new[1]], p + "lane1"),
            _node("Sigmoid", [new[2]], p + "dead0"),
            _node("Exp", [p + "dead0"], p + "dead1"),
            _node("Shape", [new[3]], p + "shape3"),
            _node("Expand", ["half", p + "shape3"], p + "e3"),
            _node("Add", [new[3], p + "e3"], p + "lane3"),
        ]
        new[0], new[1], new[3] = p + "lane0", p + "lane1", p + "lane3"
        lanes = new
    out.append(_node("Sum", lanes, "out"))
    return _model("dag", out, inits, [4, 16], [4, 16])


def _node(op: str, inputs: list[str], output: str, **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, inputs, [output], name=f"{output}/{op}", **attrs)


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def _model(
    name: str, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], shape: list[int], out_shape: list[int]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)],
        inits,
    )
    # IR 10: what ONNX Runtime 1.31 reads (onnx 1.23 writes 14 by default). Shapes everywhere, as the exporter
    # writes them: data propagation carries the static shapes through the Reshape of every chain block.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


# -- exported transformers models ----------------------------------------------------------------------------------


def transformers_model(name: str) -> tuple[str, onnx.ModelProto]:
    """A transformers model built from a config with random weights, exported by ``pipeline.exporting.stage``."""
    import torch
    import transformers

    import pipeline

    torch.manual_seed(0)
    dynamic: dict[str, Any] = {}
    if name.startswith("bert"):
        tiny = name.startswith("bert_tiny")
        layers, hidden, heads = (2, 128, 2) if tiny else (4, 512, 8)  # Google's BERT-Tiny and BERT-Small
        config = transformers.BertConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden
        )
        batch, seq = 2, 128
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[1, 100:] = 0
        sample: Any = ((), {"input_ids": torch.randint(0, config.vocab_size, (batch, seq)), "attention_mask": mask})
        if name.endswith("dynamic"):
            dims = {0: ("batch", 1, 2, 8), 1: ("seq", 8, 128, 512)}
            dynamic = {"input_ids": dims, "attention_mask": dims}
        description = f"BERT {layers} layers, hidden {hidden}, {heads} heads, batch {batch} x seq {seq}"
        model = transformers.BertModel(config).eval()
    else:
        config = transformers.ViTConfig(  # ViT-Ti/16
            num_hidden_layers=12, hidden_size=192, num_attention_heads=3, intermediate_size=768
        )
        sample = (torch.randn(1, 3, 224, 224),)
        description = "ViT-Ti/16: 12 layers, hidden 192, 3 heads, 1x3x224x224"
        model = transformers.ViTModel(config).eval()
    if dynamic:
        description += ", dynamic batch and seq"
    # transformers initialises biases to 0 and norm weights to 1; trained models have neither, and an all-zero bias
    # is an Add that onnxslim removes (and the exporter gives every zero bias the same initializer).
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            parameter.normal_(1.0 if parameter_name.endswith("orm.weight") else 0.0, 0.02)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = pipeline.export(model, sample, pipeline.Settings(dynamic=dynamic))
    return description, exported.model


# -- one measurement, in a fresh process ---------------------------------------------------------------------------


def _proc_status_kib(key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(match.group(1)) if match else 0


def _reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark of resident memory (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _run_ours(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, float]]:
    from converters.settings import Settings
    from pipeline.exporting.stage import ExportedGraph
    from pipeline.final_graph import run_passes

    metadata = {n.name: {p.key: p.value for p in n.metadata_props} for n in model.graph.node if n.metadata_props}
    # run_passes reads the I/O spec only in debug mode (with a sample feed); the synthetic graphs have none.
    exported = ExportedGraph(model, None, metadata)  # type: ignore[arg-type]
    final, records = run_passes(exported, Settings())
    passes: dict[str, float] = {}
    for record in records:
        passes[record.name] = passes.get(record.name, 0.0) + record.seconds
    passes["iterations"] = float(records[-1].iteration + 1 if records else 0)
    return final, passes


def _run_onnxslim(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, float]]:
    import onnxslim

    return onnxslim.slim(model), {}


def measure(tool: str, path: Path, save: Path | None) -> dict[str, Any]:
    """Load the model, then time the tool with the peak RSS above what the process held before it."""
    run: Callable[[onnx.ModelProto], tuple[onnx.ModelProto, dict[str, float]]]
    run = _run_ours if tool == "ours" else _run_onnxslim
    if tool == "ours":  # imports (torch among them) are not what is measured, nor are first-call module imports
        import pipeline.conversion  # noqa: F401
        from converters import default_registry

        default_registry()
    else:
        import onnxslim  # noqa: F401
    model = onnx.load(str(path))
    nodes_in = len(model.graph.node)
    gc.collect()
    rss_before = _proc_status_kib("VmRSS")
    peak_reset = _reset_peak_rss()
    load_before = os.getloadavg()[0]
    cpu, wall = time.process_time(), time.perf_counter()
    result, details = run(model)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = _proc_status_kib("VmHWM")
    if save is not None:
        onnx.save(result, str(save))
    return {
        "tool": tool,
        "seconds": wall,
        "cpu_seconds": cpu,
        "peak_rss_mib": peak / 1024,
        "peak_over_start_mib": (peak - rss_before) / 1024 if peak_reset else None,
        "nodes_in": nodes_in,
        "nodes_left": len(result.graph.node),
        "load_1min": load_before,
        "details": details,
    }


def child_main(tool: str, path: str, save: str | None) -> int:
    warnings.simplefilter("ignore")
    result = measure(tool, Path(path), Path(save) if save else None)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


# -- the parent: graphs, interleaved runs, verification, table -----------------------------------------------------


@dataclass
class GraphResult:
    name: str
    description: str
    nodes_in: int
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    outputs_match: dict[str, str] = field(default_factory=dict)

    def median(self, tool: str, key: str) -> float | None:
        values = [r[key] for r in self.runs.get(tool, []) if r.get(key) is not None]
        return statistics.median(values) if values else None

    def nodes_left(self, tool: str) -> int | None:
        runs = self.runs.get(tool)
        return runs[0]["nodes_left"] if runs else None


def run_child(tool: str, path: Path, save: Path | None) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", tool, str(path)]
    if save is not None:
        command += ["--save", str(save)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line[len(RESULT_PREFIX) :]))
    raise RuntimeError(f"{tool} on {path.name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def measure_graph(result: GraphResult, path: Path, tools: list[str], runs: int, large_runs: int, out: Path) -> None:
    """Alternate the tools run by run (which goes first alternates too); the first run of each saves its graph."""
    counts = {t: (large_runs if t == "onnxslim" and result.nodes_in >= LARGE_GRAPH else runs) for t in tools}
    for i in range(max(counts.values())):
        order = tools if i % 2 == 0 else tools[::-1]
        for tool in order:
            if i >= counts[tool]:
                continue
            save = out / f"{result.name}.{tool}.onnx" if i == 0 else None
            run = run_child(tool, path, save)
            result.runs.setdefault(tool, []).append(run)
            print(
                f"  [{result.name}] {tool:<8} run {i + 1}/{counts[tool]}: {run['seconds']:7.2f} s, "
                f"{run['nodes_left']} nodes left, load {run['load_1min']:.2f}",
                flush=True,
            )


def verify(result: GraphResult, original: Path, out: Path, tools: list[str]) -> None:
    """Run the original and each tool's graph on ONNX Runtime with one random feed; outputs must agree."""
    import onnxruntime as ort

    def outputs(path: Path) -> list[np.ndarray]:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # fast on 80k nodes
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return [np.asarray(o) for o in session.run(None, feed)]

    model = onnx.load(str(original), load_external_data=False)
    rng = np.random.default_rng(0)
    feed = {}
    for value in model.graph.input:
        tensor_type = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 8 for d in tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        feed[value.name] = (
            rng.integers(0, 2, shape).astype(dtype)  # valid token ids and mask values alike
            if np.issubdtype(dtype, np.integer)
            else rng.standard_normal(shape).astype(dtype)
        )
    expected = outputs(original)
    for tool in tools:
        got = outputs(out / f"{result.name}.{tool}.onnx")
        worst = max(
            float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            for a, b in zip(expected, got, strict=True)
        )
        same = all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(expected, got, strict=True))
        result.outputs_match[tool] = f"{'yes' if same else 'NO'} (max |diff| {worst:.1e})"


def format_table(results: list[GraphResult], tools: list[str]) -> str:
    header = (
        f"{'graph':<20} {'nodes in':>9}  {'tool':<8} {'runs':>4} {'median s':>9} {'min-max s':>13} {'cpu s':>7} "
        f"{'us/node':>8} {'peak +MiB':>9} {'nodes left':>10}  {'outputs':<22}"
    )
    lines = ["", header, "-" * len(header)]
    for r in results:
        for tool in tools:
            runs = r.runs.get(tool)
            if not runs:
                continue
            seconds = [x["seconds"] for x in runs]
            median = statistics.median(seconds)
            peak = r.median(tool, "peak_over_start_mib")
            lines.append(
                f"{r.name:<20} {r.nodes_in:>9}  {tool:<8} {len(runs):>4} {median:>9.2f} "
                f"{min(seconds):>6.2f}-{max(seconds):<6.2f} {r.median(tool, 'cpu_seconds') or 0:>7.2f} "
                f"{median / r.nodes_in * 1e6:>8.1f} {peak if peak is not None else float('nan'):>9.0f} "
                f"{r.nodes_left(tool):>10}  {r.outputs_match.get(tool, '-'):<22}"
            )
    return "\n".join(lines)


def verdicts(results: list[GraphResult], tools: list[str]) -> tuple[list[str], bool]:
    """Per graph: time ratio and nodes left against onnxslim; per family: time per node from smallest to largest.
    Verdicts are on the wall clock; the same figures on process CPU seconds (all threads), which other processes
    move less, are printed beside them."""
    lines = ["", "Targets (issue 4): our time <= 1/5 of onnxslim's with no more nodes left; time per node flat"]
    ok = True
    if "onnxslim" in tools:
        for r in results:
            ours, slim = r.median("ours", "seconds"), r.median("onnxslim", "seconds")
            ours_cpu, slim_cpu = r.median("ours", "cpu_seconds"), r.median("onnxslim", "cpu_seconds")
            ours_nodes, slim_nodes = r.nodes_left("ours"), r.nodes_left("onnxslim")
            if ours is None or slim is None or not ours_cpu or not slim_cpu or ours_nodes is None or slim_nodes is None:
                continue
            time_ok, nodes_ok = ours <= MAX_TIME_RATIO * slim, ours_nodes <= slim_nodes
            ok &= time_ok and nodes_ok
            lines.append(
                f"  {r.name:<20} time ratio {ours / slim:5.3f} ({'met' if time_ok else 'MISSED'}; CPU "
                f"{ours_cpu / slim_cpu:5.3f}), nodes left {ours_nodes} vs {slim_nodes} "
                f"({'met' if nodes_ok else 'MISSED'})"
            )
    for family in FAMILIES:
        sized = sorted((r for r in results if r.name.startswith(family + "_")), key=lambda r: r.nodes_in)
        if len(sized) < 2:
            continue
        per_node = [(r.median("ours", "seconds") or 0) / r.nodes_in * 1e6 for r in sized]
        per_node_cpu = [(r.median("ours", "cpu_seconds") or 0) / r.nodes_in * 1e6 for r in sized]
        growth, growth_cpu = per_node[-1] / per_node[0], per_node_cpu[-1] / per_node_cpu[0]
        flat = growth <= MAX_PER_NODE_GROWTH
        ok &= flat
        steps = " -> ".join(f"{v:.1f}" for v in per_node)
        lines.append(
            f"  {family}: our us/node {steps} ({sized[0].nodes_in} -> {sized[-1].nodes_in} nodes), x{growth:.2f} "
            f"({'flat' if flat else 'NOT flat'}: target <= x{MAX_PER_NODE_GROWTH}; CPU x{growth_cpu:.2f})"
        )
    return lines, ok


def pass_breakdown(results: list[GraphResult]) -> list[str]:
    lines = ["", "Our time by step (median seconds; the rest is to_graph, to_model and the ONNX check):"]
    for r in results:
        runs = r.runs.get("ours", [])
        if not runs:
            continue
        keys = [k for k in runs[0]["details"] if k != "iterations"]
        medians = {k: statistics.median(x["details"].get(k, 0.0) for x in runs) for k in keys}
        rest = statistics.median(x["seconds"] - sum(x["details"].get(k, 0.0) for k in keys) for x in runs)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in medians.items() if v >= 0.01)
        iterations = int(runs[0]["details"].get("iterations", 0))
        lines.append(f"  {r.name:<20} {iterations} iterations; {shown}; rest {rest:.2f}")
    return lines


def build_inputs(args: argparse.Namespace, work: Path) -> list[tuple[GraphResult, Path]]:
    inputs = []
    builders = {"chain": chain_graph, "dag": dag_graph}
    for family in args.families:
        for size in args.sizes:
            model = builders[family](size)
            name = f"{family}_{size // 1000}k"
            path = work / f"{name}.onnx"
            onnx.save(model, str(path))
            description = f"{family} of {len(model.graph.node)} nodes"
            inputs.append((GraphResult(name, description, len(model.graph.node)), path))
    for name in args.models:
        description, model = transformers_model(name)
        path = work / f"{name}.onnx"
        onnx.save(model, str(path))
        inputs.append((GraphResult(name, description, len(model.graph.node)), path))
        print(f"  exported {name}: {description}, {len(model.graph.node)} nodes", flush=True)
    return inputs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--sizes", nargs="+", type=int, help=f"node counts of synthetic graphs (default {SIZES})")
    parser.add_argument("--models", nargs="*", choices=MODELS, help="exported models (default: all; none: no model)")
    parser.add_argument("--runs", type=int, help="measurements per tool and graph, median reported (default 3)")
    parser.add_argument(
        "--large-runs", type=int, default=1, help=f"onnxslim measurements on graphs of {LARGE_GRAPH}+ nodes"
    )
    parser.add_argument("--no-slim", action="store_true", help="measure our pass list alone")
    parser.add_argument("--quick", action="store_true", help="defaults become 10k-node graphs, bert_tiny, one run")
    parser.add_argument("--keep", type=Path, help="directory for the graphs (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="write all measurements here")
    parser.add_argument("--measure", choices=TOOLS, help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    parser.add_argument("path", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    args.sizes = args.sizes or ([10_000] if quick else list(SIZES))
    args.models = args.models if args.models is not None else (["bert_tiny"] if quick else list(MODELS))
    args.runs = args.runs or (1 if quick else 3)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.measure:
        return child_main(args.measure, args.path, args.save)
    tools = ["ours"]
    if args.no_slim:
        print("onnxslim comparison off (--no-slim): our pass list alone")
    elif importlib.util.find_spec("onnxslim") is None:
        print("onnxslim is not installed: measuring our pass list alone. For the comparison: pip install onnxslim")
    else:
        tools.append("onnxslim")
    started, load_start = time.perf_counter(), os.getloadavg()
    print(
        f"tools {', '.join(tools)}; runs {args.runs} (onnxslim on {LARGE_GRAPH}+ nodes: {args.large_runs}); "
        f"{os.cpu_count()} CPUs; load average {_load(load_start)}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        inputs = build_inputs(args, work)
        results = []
        for result, path in inputs:
            print(f"{result.name}: {result.description}", flush=True)
            measure_graph(result, path, tools, args.runs, args.large_runs, work)
            verify(result, path, work, tools)
            results.append(result)
    load_end = os.getloadavg()
    print(format_table(results, tools))
    print("\n".join(pass_breakdown(results)))
    lines, ok = verdicts(results, tools)
    print("\n".join(lines))
    elapsed = time.perf_counter() - started
    print(f"\ntotal {elapsed:.0f} s; 1/5/15-min load average at start {_load(load_start)}, at end {_load(load_end)}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "environment": {
                        "python": platform.python_version(),
                        "cpus": os.cpu_count(),
                        "onnx": onnx.__version__,
                    },
                    "load_average": {"start": load_start, "end": load_end},
                    "targets": {
                        "max_time_ratio": MAX_TIME_RATIO,
                        "max_per_node_growth": MAX_PER_NODE_GROWTH,
                        "met": ok,
                    },
                    "graphs": [asdict(r) for r in results],
                    "total_seconds": elapsed,
                },
                indent=2,
            )
        )
    return 0


def _load(values: tuple[float, float, float]) -> str:
    return "/".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
