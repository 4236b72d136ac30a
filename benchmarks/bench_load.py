"""Benchmark loading a saved generation artifact: ``pipeline.load(path)`` in fresh processes, beside the floor, a bare
``onnxruntime.InferenceSession`` of the same ONNX graph (the artifact's graph and weights written out as an ONNX file
with its data file), and beside ONNX Runtime GenAI's ``og.Model`` of its own build of the model (``--genai DIR``).

Each measurement runs in its own process, after ``import torch`` and ``import pipeline`` (ours, each timed and
printed apart) or ``import onnxruntime`` (the floor: its import is printed apart, ours pays it inside
``pipeline.load``); the median over ``--runs`` is reported, after one warm-up run of each (page cache, bytecode), the
measurements taking turns within each round so that a change in the machine's load falls on all of them. Ours and
GenAI's are then timed a second time in the same process (``again``: the imports done, what a process that loads
several models pays). Python's bytecode of the child processes is cached in a scratch directory even where
``PYTHONDONTWRITEBYTECODE`` is set (compiling the modules a load imports costs 0.5 s on a 2-core machine, which no
deployment pays); ``--as-is`` keeps the environment. The floor is given with ONNX Runtime's default options (weights
prepacked, as our loaded module does for weights under ``external_data_threshold``) and with prepacking off
(``ort_prepack_weights=False``).

Each snippet reports the wall time and the process's CPU time (all its threads): on a shared machine the first
follows the other work, the second much less. ONNX Runtime GenAI's load (``--genai``: a folder written by ``python -m
onnxruntime_genai.models.builder -i CHECKPOINT -o DIR -p fp32 -e cpu``) imports ``onnxruntime_genai`` first (printed
apart) and times ``og.Model(DIR)``. ``--baseline DIR`` also measures the ``pipeline`` of another checkout (``git
archive COMMIT | tar -x -C DIR``) on the same artifact, in the same turns: a change's before and after in one run.
A stored session graph is run only by the code whose fingerprint it carries (``pipeline.runtime.ort.stored_graph``):
when a change touches that code, give the baseline an artifact saved (or keyed) by it with ``--baseline-artifact``,
else one of the two loads rewrites the graph.

A float32 generation step's load returns with an unprepacked session and makes the prepacked one in a background
thread (``pipeline.runtime.ort.prepacking``): ``prepacked ready`` is the time from the load's call until that session
runs every call (CPU: every thread's, the build's included). So that a faster load is not a slower first token, the
``first token`` measurement (on by default; ``--no-first-token``) times, in one fresh process, the load, a
``--prompt``-token prompt's prefill and one decode step (``generate(ids, max_new_tokens=2)``, one intra-op thread,
spinning off), and, with ``--genai``, GenAI's ``og.Model`` with the same threads then an ``og.Generator``'s
``append_tokens`` and two ``generate_next_token`` (and the baseline's, with ``--baseline``).

Run from the repository root::

    python benchmarks/bench_load.py                          # a random Llama (hidden 512, 8 layers, vocab 32000)
    python benchmarks/bench_load.py --artifact model.ptrt --runs 9 --genai genai-llama/
    python benchmarks/bench_load.py --artifact model.ptrt --baseline /tmp/head --genai genai-llama/
    python benchmarks/bench_load.py --size small --json load.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: (hidden, intermediate, layers, heads, kv heads, vocab) of the random Llama the benchmark converts.
SIZES = {"big": (512, 1408, 8, 8, 4, 32000), "small": (64, 128, 2, 4, 2, 256)}

OURS = """
import gc, sys, time
sys.path.insert(0, {root!r})
start, cpu = time.perf_counter(), time.process_time()
import torch
torch_wall, torch_cpu = time.perf_counter() - start, time.process_time() - cpu
start, cpu = time.perf_counter(), time.process_time()
import pipeline
pipeline_wall, pipeline_cpu = time.perf_counter() - start, time.process_time() - cpu
assert pipeline.__file__.startswith({root!r}), pipeline.__file__
start, cpu = time.perf_counter(), time.process_time()
module = pipeline.load({path!r})
load_wall, load_cpu = time.perf_counter() - start, time.process_time() - cpu
stored = float(getattr(module.executor, "stored_graph", False))  # did it run the artifact's stored session graph?
wait = getattr(getattr(module.executor, "session", None), "wait", None)  # a prepacked session made in the background
if wait is not None:
    wait()
ready_wall, ready_cpu = time.perf_counter() - start, time.process_time() - cpu
del module
gc.collect()
start, cpu = time.perf_counter(), time.process_time()
module = pipeline.load({path!r})
again_wall, again_cpu = time.perf_counter() - start, time.process_time() - cpu
wait = getattr(getattr(module.executor, "session", None), "wait", None)
if wait is not None:
    wait()
print(torch_wall, torch_cpu, pipeline_wall, pipeline_cpu, load_wall, load_cpu, ready_wall, ready_cpu, again_wall,
      again_cpu, stored)
"""

#: The first token: a load, then a 128-token prompt's prefill and one decode step (two greedy tokens), one thread,
#: spinning off, in a fresh process after ``import torch`` and ``import pipeline``: the time from ``pipeline.load``'s
#: call to the second token, and its two parts.
FIRST_OURS = """
import sys, time
sys.path.insert(0, {root!r})
import numpy as np, torch
import pipeline
ids = torch.from_numpy(np.random.default_rng(0).integers(0, {vocab}, (1, {prompt}))).long()
start, cpu = time.perf_counter(), time.process_time()
module = pipeline.load({path!r}, threads=1, spinning=False)
loaded, cpu_loaded = time.perf_counter(), time.process_time()
module.generate(ids, max_new_tokens=2, eos_token_id=[])
done, cpu_done = time.perf_counter(), time.process_time()
print(loaded - start, cpu_loaded - cpu, done - loaded, cpu_done - cpu_loaded, done - start, cpu_done - cpu)
"""

#: GenAI's first token as ours: ``og.Model`` (after ``import onnxruntime_genai``), then a generator's
#: ``append_tokens`` (the prefill) and two ``generate_next_token`` (the prefill's token, then one decode step).
FIRST_GENAI = """
import json, time
import numpy as np
import onnxruntime_genai as og
ids = np.random.default_rng(0).integers(0, {vocab}, (1, {prompt})).astype(np.int32)
start, cpu = time.perf_counter(), time.process_time()
config = og.Config({path!r})
options = {{"intra_op_num_threads": 1, "session.intra_op.allow_spinning": "0"}}
config.overlay(json.dumps({{"model": {{"decoder": {{"session_options": options}}}}}}))
model = og.Model(config)
loaded, cpu_loaded = time.perf_counter(), time.process_time()
params = og.GeneratorParams(model)
params.set_search_options(max_length={prompt} + 2, do_sample=False, batch_size=1)
generator = og.Generator(model, params)
generator.append_tokens(ids)
generator.generate_next_token()
generator.generate_next_token()
done, cpu_done = time.perf_counter(), time.process_time()
print(loaded - start, cpu_loaded - cpu, done - loaded, cpu_done - cpu_loaded, done - start, cpu_done - cpu)
"""

GENAI = """
import gc, time
start, cpu = time.perf_counter(), time.process_time()
import onnxruntime_genai as og
imported, cpu_imported = time.perf_counter(), time.process_time()
model = og.Model({path!r})
loaded, cpu_loaded = time.perf_counter(), time.process_time()
del model
gc.collect()
again, cpu_again = time.perf_counter(), time.process_time()
og.Model({path!r})
print(imported - start, cpu_imported - cpu, loaded - imported, cpu_loaded - cpu_imported, time.perf_counter() - again,
      time.process_time() - cpu_again)
"""

FLOOR = """
import time
start, cpu = time.perf_counter(), time.process_time()
import onnxruntime as ort
imported, cpu_imported = time.perf_counter(), time.process_time()
options = ort.SessionOptions()
options.log_severity_level = 3
if {no_prepack}:
    options.add_session_config_entry("session.disable_prepacking", "1")
ort.InferenceSession({path!r}, options, providers=["CPUExecutionProvider"])
print(imported - start, cpu_imported - cpu, time.perf_counter() - imported, time.process_time() - cpu_imported)
"""


def make_artifact(path: Path, size: str) -> Path:
    """Convert a random ``LlamaForCausalLM`` as one generation step (``max_length=256, max_batch=4``) and save it."""
    sys.path.insert(0, str(ROOT))
    sys.path.append(str(ROOT / "tests"))
    import tests_environment  # noqa: F401  (torchvision's operator schemas, before transformers imports it)
    import torch
    import transformers

    import pipeline

    hidden, intermediate, layers, heads, kv_heads, vocab = SIZES[size]
    config = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, vocab, (1, 16))
    module = pipeline.convert(model, ids, generation={"max_length": 256, "max_batch": 4}, validate=False)
    return module.save(path)


def write_onnx(artifact: Path, directory: Path) -> Path:
    """The artifact's graph as ``model.onnx`` with its weights in ``model.onnx.data`` beside it (format /3 keeps them
    in that member, with the graph's locations pointing at it), for the floor."""
    with zipfile.ZipFile(artifact) as archive:
        archive.extract("model.onnx", directory)
        if "model.onnx.data" in archive.namelist():
            archive.extract("model.onnx.data", directory)
    return directory / "model.onnx"


def run(code: str, env: dict[str, str]) -> list[float]:
    """The numbers the snippet prints, from a fresh process."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    return [float(v) for v in done.stdout.strip().splitlines()[-1].split()]


@dataclass
class Measurement:
    """One snippet run in fresh processes."""

    code: str
    env: dict[str, str]
    samples: list[list[float]] = field(default_factory=list)

    def once(self) -> list[float]:
        return run(self.code, self.env)

    def medians(self) -> list[float]:
        return [statistics.median(column) for column in zip(*self.samples, strict=True)]


def measure_in_turns(measurements: dict[str, Measurement], runs: int) -> None:
    """A warm-up run of each, then ``runs`` rounds in which each measurement runs once, in turn."""
    for measurement in measurements.values():
        measurement.once()
    for _ in range(runs):
        for measurement in measurements.values():
            measurement.samples.append(measurement.once())


def artifact_vocabulary(artifact: Path) -> int:
    """The vocabulary of a saved generation step (its logits' last dimension), for the first token's prompt."""
    with zipfile.ZipFile(artifact) as archive:
        metadata = json.loads(archive.read("metadata.json"))
    for name, _, shape, *_ in metadata["io"]["outputs"]:
        if name == "logits":
            return int(shape[-1])
    raise SystemExit(f"{artifact} has no logits output: not a generation step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, help="an artifact to load (default: convert a random Llama)")
    parser.add_argument("--size", choices=sorted(SIZES), default="big", help="the random Llama's size")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per measurement (median reported)")
    parser.add_argument("--genai", type=Path, help="an ONNX Runtime GenAI model folder of the same model, to load too")
    parser.add_argument("--baseline", type=Path, help="a checkout of another version whose pipeline.load to time too")
    parser.add_argument("--baseline-artifact", type=Path, help="the artifact the baseline loads (default: --artifact)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--first-token",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time a load, a prompt's prefill and one decode step in one fresh process (default on)",
    )
    parser.add_argument("--prompt", type=int, default=128, help="the first token's prompt length")
    parser.add_argument("--as-is", action="store_true", help="no bytecode cache for the child processes")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-load-") as scratch:
        env = dict(os.environ)
        if not args.as_is:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(scratch) / "pycache")
        artifact = args.artifact or make_artifact(Path(scratch) / f"llama-{args.size}.ptrt", args.size)
        graph = write_onnx(artifact, Path(scratch) / "onnx")
        measurements = {"pipeline.load": Measurement(OURS.format(root=str(ROOT), path=str(artifact)), env)}
        if args.baseline is not None:
            code = OURS.format(root=str(args.baseline.resolve()), path=str(args.baseline_artifact or artifact))
            measurements["pipeline.load (baseline)"] = Measurement(code, env)
        measurements["ort.InferenceSession"] = Measurement(FLOOR.format(path=str(graph), no_prepack=False), env)
        code = FLOOR.format(path=str(graph), no_prepack=True)
        measurements["ort.InferenceSession, no prepacking"] = Measurement(code, env)
        if args.genai is not None:
            measurements["og.Model (ONNX Runtime GenAI)"] = Measurement(GENAI.format(path=str(args.genai)), env)
        if args.first_token:
            first = {"vocab": artifact_vocabulary(artifact), "prompt": args.prompt}
            code = FIRST_OURS.format(root=str(ROOT), path=str(artifact), **first)
            measurements["first token"] = Measurement(code, env)
            if args.baseline is not None:
                path = str(args.baseline_artifact or artifact)
                code = FIRST_OURS.format(root=str(args.baseline.resolve()), path=path, **first)
                measurements["first token (baseline)"] = Measurement(code, env)
            if args.genai is not None:
                code = FIRST_GENAI.format(path=str(args.genai), **first)
                measurements["first token (ONNX Runtime GenAI)"] = Measurement(code, env)
        measure_in_turns(measurements, args.runs)
        results: dict[str, Any] = {
            "artifact": str(artifact),
            "artifact_mb": round(os.path.getsize(artifact) / 1e6, 1),
            "runs": args.runs,
            "baseline": str(args.baseline) if args.baseline is not None else None,
            "baseline_artifact": str(args.baseline_artifact or artifact) if args.baseline is not None else None,
        }
        for name, measurement in measurements.items():  # (wall, cpu) pairs in the order the snippet prints them
            medians = measurement.medians()
            if name.startswith("pipeline.load"):
                results[f"stored session graph run{name.removeprefix('pipeline.load')}"] = medians.pop() == 1.0
            pairs = [{"wall": w, "cpu": c} for w, c in zip(*[iter(medians)] * 2, strict=True)]
            if name.startswith("pipeline.load"):
                suffix = name.removeprefix("pipeline.load")
                results[f"import torch{suffix}"], results[f"import pipeline{suffix}"] = pairs[0], pairs[1]
                results[name], results[f"{name}, prepacked ready"], results[f"{name}, again"] = pairs[2:5]
            elif name.startswith("first token"):
                suffix = name.removeprefix("first token")
                results[f"first token{suffix}: load"], results[f"first token{suffix}: prefill + 1 step"] = pairs[:2]
                results[name] = pairs[2]
            elif name.startswith("og.Model"):
                results["import onnxruntime_genai"], results[name], results[f"{name}, again"] = pairs
            else:
                results["import onnxruntime"], results[name] = pairs
    results["load_average"] = {"before": list(load_before), "after": list(os.getloadavg())}
    results["bytecode_cache"] = not args.as_is
    cache = "bytecode cached" if not args.as_is else "environment as is"
    print(f"{results['artifact']} ({results['artifact_mb']} MB), median of {args.runs} fresh processes ({cache}):")
    timed = [key for key in results if isinstance(results[key], dict) and "wall" in results[key]]
    width = max(len(k) for k in timed)
    print(f"  {'':<{width}}  wall s   CPU s (all threads)")
    for key in timed:
        print(f"  {key:<{width}}  {results[key]['wall']:6.3f}  {results[key]['cpu']:6.3f}")
    for key in [k for k in results if k.startswith("stored session graph run")]:
        if not results[key]:  # the artifact's graph was made by other code: this load rewrote it (slower)
            print(f"  {key}: no (its fingerprint is another code's: see --baseline-artifact)")
    genai = results.get("og.Model (ONNX Runtime GenAI)")
    if genai is not None:
        for key in ("pipeline.load", "pipeline.load, again", "pipeline.load (baseline)"):
            if key in results:
                peer = genai if "again" not in key else results["og.Model (ONNX Runtime GenAI), again"]
                print(f"  {key} / GenAI's: {results[key]['wall'] / peer['wall']:.2f}x wall")
        peer = results.get("first token (ONNX Runtime GenAI)")
        for key in ("first token", "first token (baseline)"):
            if key in results and peer is not None:
                print(f"  {key} / GenAI's: {results[key]['wall'] / peer['wall']:.2f}x wall")
    if "pipeline.load (baseline)" in results:
        for key in ("pipeline.load", "first token"):
            if f"{key} (baseline)" in results:
                ratio = results[key]["wall"] / results[f"{key} (baseline)"]["wall"]
                print(f"  {key} / baseline's: {ratio:.2f}x wall")
    print(
        f"  load average (1, 5, 15 min) before {', '.join(f'{v:.2f}' for v in load_before)}, "
        f"after {', '.join(f'{v:.2f}' for v in results['load_average']['after'])} ({os.cpu_count()} cores)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
