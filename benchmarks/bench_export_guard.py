"""What the guard on onnxscript's two-output matcher saves per export (``pipeline/exporting/rewriter_guard.py``).

Without the guard, the exporter's optimizer indexes the whole graph at every node for one rewrite pattern, a cost
quadratic in the graph's node count. Each round converts every model twice with ``pipeline.convert`` (ONNX Runtime
backend, validation off: only the export differs): once with the guard replaced by a no-op (as every export ran
before) and once with it, in alternating order; the medians of the export stage (``report.stages``) and their ratio
are printed per model, with the node count. Models: GPT-2 from configs of 2, 8 and 16 layers (random weights), so
the growth with the graph shows.

Run from the repository root::

    python benchmarks/bench_export_guard.py --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))

import pipeline  # noqa: E402
from pipeline.exporting import rewriter_guard, stage  # noqa: E402


def gpt2(layers: int) -> tuple[torch.nn.Module, Any]:
    """transformers' GPT2Model, hidden 64, 4 heads, ``layers`` blocks, 32 tokens."""
    import tests_environment  # noqa: F401  (torchvision's op schemas before transformers imports it)
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_embd=64, n_layer=layers, n_head=4, n_positions=64, vocab_size=100, use_cache=False)
    return GPT2Model(config).eval(), torch.randint(0, 100, (1, 32))


def export_seconds(model: torch.nn.Module, sample: Any, guarded: bool) -> tuple[float, int]:
    """The export stage's seconds and the exported graph's node count, with or without the guard."""
    guard = rewriter_guard.linear_multi_output_matching if guarded else contextlib.nullcontext
    stage.linear_multi_output_matching = guard  # type: ignore[attr-defined]  # what stage.py enters per export
    try:
        module = pipeline.convert(model, sample, validate=False)
    finally:
        stage.linear_multi_output_matching = rewriter_guard.linear_multi_output_matching  # type: ignore[attr-defined]
    return dict(module.report.stages)["export"], len(module.onnx.graph.node)


def main(argv: list[str] | None = None) -> int:
    """Alternate unguarded and guarded exports per model and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", default="2,8,16", help="GPT-2 depths, comma-separated")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}; {args.rounds} rounds, medians of the export stage in seconds")
    print("| model | nodes | unguarded | guarded | saved | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for layers in (int(n) for n in args.layers.split(",")):
        model, sample = gpt2(layers)
        export_seconds(model, sample, guarded=True)  # warm-up: imports, the translation table
        times: dict[bool, list[float]] = {True: [], False: []}
        nodes = 0
        for round_ in range(args.rounds):
            for guarded in (False, True) if round_ % 2 == 0 else (True, False):
                seconds, nodes = export_seconds(model, sample, guarded)
                times[guarded].append(seconds)
        slow, fast = statistics.median(times[False]), statistics.median(times[True])
        row = f"| GPT-2, {layers} layers | {nodes} | {slow:.2f} | {fast:.2f} | {slow - fast:.2f} | {slow / fast:.2f}x |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
