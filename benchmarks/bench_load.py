"""Benchmark loading a saved generation artifact: ``pipeline.load(path)`` in fresh processes, beside the floor, a bare
``onnxruntime.InferenceSession`` of the same ONNX graph (the artifact's graph and weights written out as an ONNX file
with its data file).

Each measurement runs in its own process, after ``import torch`` and ``import pipeline`` (ours) or ``import
onnxruntime`` (the floor: its import is printed apart, ours pays it inside ``pipeline.load``); the median over
``--runs`` is reported, after one warm-up run of each (page cache, bytecode). Python's bytecode of the child processes
is cached in a scratch directory even where ``PYTHONDONTWRITEBYTECODE`` is set (compiling the modules a load imports
costs 0.5 s on a 2-core machine, which no deployment pays); ``--as-is`` keeps the environment. The floor is given
with ONNX Runtime's default options (weights prepacked, as our loaded module does for weights under
``external_data_threshold``) and with prepacking off (``ort_prepack_weights=False``).
ONNX Runtime GenAI is reported only when ``onnxruntime_genai`` imports (it needs its own model folder and is not
measured here).

Run from the repository root::

    python benchmarks/bench_load.py                          # a random Llama (hidden 512, 8 layers, vocab 32000)
    python benchmarks/bench_load.py --artifact model.ptrt --runs 9
    python benchmarks/bench_load.py --size small --json load.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: (hidden, intermediate, layers, heads, kv heads, vocab) of the random Llama the benchmark converts.
SIZES = {"big": (512, 1408, 8, 8, 4, 32000), "small": (64, 128, 2, 4, 2, 256)}

OURS = """
import sys, time
sys.path.insert(0, {root!r})
import torch, pipeline
start = time.perf_counter()
pipeline.load({path!r})
print(time.perf_counter() - start)
"""

FLOOR = """
import time
start = time.perf_counter()
import onnxruntime as ort
imported = time.perf_counter()
options = ort.SessionOptions()
options.log_severity_level = 3
if {no_prepack}:
    options.add_session_config_entry("session.disable_prepacking", "1")
ort.InferenceSession({path!r}, options, providers=["CPUExecutionProvider"])
print(imported - start, time.perf_counter() - imported)
"""


def make_artifact(path: Path, size: str) -> Path:
    """Convert a random ``LlamaForCausalLM`` as one generation step (``max_length=256, max_batch=4``) and save it."""
    import torch
    import transformers

    sys.path.insert(0, str(ROOT))
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


def median_of(code: str, runs: int, env: dict[str, str]) -> list[float]:
    """The median of each printed number over ``runs`` fresh processes, after a warm-up one."""
    run(code, env)
    samples = [run(code, env) for _ in range(runs)]
    return [statistics.median(column) for column in zip(*samples, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, help="an artifact to load (default: convert a random Llama)")
    parser.add_argument("--size", choices=sorted(SIZES), default="big", help="the random Llama's size")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per measurement (median reported)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--as-is", action="store_true", help="no bytecode cache for the child processes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-load-") as scratch:
        env = dict(os.environ)
        if not args.as_is:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(scratch) / "pycache")
        artifact = args.artifact or make_artifact(Path(scratch) / f"llama-{args.size}.ptrt", args.size)
        graph = write_onnx(artifact, Path(scratch) / "onnx")
        results: dict[str, Any] = {
            "artifact": str(artifact),
            "artifact_mb": round(os.path.getsize(artifact) / 1e6, 1),
            "runs": args.runs,
            "pipeline.load": median_of(OURS.format(root=str(ROOT), path=str(artifact)), args.runs, env)[0],
        }
        for name, no_prepack in (("ort.InferenceSession", False), ("ort.InferenceSession, no prepacking", True)):
            imported, session = median_of(FLOOR.format(path=str(graph), no_prepack=no_prepack), args.runs, env)
            results[name] = session
            results["import onnxruntime"] = imported
    genai = importlib.util.find_spec("onnxruntime_genai") is not None
    results["onnxruntime_genai"] = "installed, not measured (needs its model folder)" if genai else "not installed"
    results["bytecode_cache"] = not args.as_is
    cache = "bytecode cached" if not args.as_is else "environment as is"
    print(f"{results['artifact']} ({results['artifact_mb']} MB), median of {args.runs} fresh processes ({cache}):")
    width = max(len(k) for k in results)
    for key in ("pipeline.load", "ort.InferenceSession", "ort.InferenceSession, no prepacking", "import onnxruntime"):
        print(f"  {key:<{width}}  {results[key]:.3f} s")
    print(f"  {'onnxruntime_genai':<{width}}  {results['onnxruntime_genai']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
