"""Validation perplexity of a character-level transformer language model trained on CPython's own documentation
(``pydoc_data/topics.py``; the model and data are the tests', ``tests/charlm_support.py``), in PyTorch fp32 and
converted to fp16, INT8, FP8, INT4 (max and AWQ scales), NVFP4 (max and AWQ; weight-only and W4A4) and the 4-bit
embedding tables on ONNX Runtime's CPU provider: the accuracy table of issue 26, with greedy continuations, the
artifact sizes and the one-step latency.

Every conversion gets the same calibration text (``calibration_batches``: windows of the training text). INT8/FP8
compute in float16 around the 8-bit ops, and the 4-bit precisions keep activations in float16 (W4A16), as TensorRT
runs them; ONNX Runtime runs the float16 parts as their exact float32 emulation, FP8 and NVFP4 through exact
emulations (no kernels), INT4 through MatMulNBits at accuracy level 1 (float32 activations: exact). The latency
column converts again with ``quantize_fallback="fp32"`` (ONNX Runtime's real fp32 and 4-bit kernels, no emulation).

    python benchmarks/quantize_charlm.py --train-steps 300
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from charlm_support import CONTEXT, calibration_batches, greedy, perplexity, train, validation_batches  # noqa: E402

import pipeline  # noqa: E402

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("fp16", {"precision": "fp16"}),
    ("int8", {"precision": "int8"}),
    ("fp8", {"precision": "fp8"}),
    ("int4 max", {"precision": "int4"}),
    ("int4 awq", {"precision": "int4", "calibration_method": "awq"}),
    ("nvfp4 max", {"precision": "nvfp4"}),
    ("nvfp4 awq", {"precision": "nvfp4", "calibration_method": "awq"}),
    ("nvfp4 W4A4 max", {"precision": "nvfp4", "nvfp4_activations": True}),
    ("nvfp4 W4A4 awq", {"precision": "nvfp4", "nvfp4_activations": True, "calibration_method": "awq"}),
    ("int4 max, embeddings in 4 bits", {"precision": "int4", "quantize_embeddings": True}),
    ("nvfp4 max, embeddings in 4 bits", {"precision": "nvfp4", "quantize_embeddings": True}),
]
PROMPT = "The return statement"


def latency(module: torch.nn.Module, sample: torch.Tensor, runs: int = 30) -> float:
    """Median seconds of one forward call."""
    with torch.no_grad():
        for _ in range(3):
            module(sample)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            module(sample)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Train, convert every way of :data:`VARIANTS`, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-seconds", type=float, default=None, help="train for this long (default: steps)")
    parser.add_argument("--train-steps", type=int, default=300, help="train this many steps of 16 windows")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="convert only these variants (names as printed)")
    parser.add_argument("--no-latency", action="store_true", help="skip the one-step latency")
    args = parser.parse_args()
    torch.set_num_threads(2)
    steps = None if args.train_seconds else args.train_steps
    start = time.perf_counter()
    model, steps = train(steps, args.train_seconds, width=args.width, layers=args.layers, batch=16)
    elapsed = time.perf_counter() - start
    valid, calibration = validation_batches(), calibration_batches()
    sample = calibration[0]
    batch = {"input_ids": {0: ("batch", 1, 8, 8)}}  # greedy decoding calls with one window
    base = perplexity(model, valid)
    print(
        f"trained {steps} steps of 16x{CONTEXT} characters in {elapsed:.0f} s: width {args.width}, "
        f"{args.layers} layers, {sum(p.numel() for p in model.parameters()):,} parameters\n"
    )
    print("| precision | validation perplexity | vs fp32 | MatMul weights in low bits | artifact (fp32 = 1) |")
    print("| --- | --- | --- | --- | --- |")
    texts = {"fp32": greedy(model, PROMPT, 80)}
    with tempfile.TemporaryDirectory() as directory:
        fp32_module = pipeline.convert(model, sample, validate=False, dynamic=batch)
        fp32_size = fp32_module.save(Path(directory) / "fp32.ptrt").stat().st_size
        print(f"| fp32 (PyTorch) | {base:.3f} | | | 1.00 |")
        for name, settings in VARIANTS:
            if args.only is not None and name not in args.only:
                continue
            module = pipeline.convert(model, sample, calibration=calibration, dynamic=batch, **settings)
            ppl = perplexity(module, valid)
            report = module.report.quantization
            share = f"{report.weight_share:.1%}" if report is not None else ""
            size = module.save(Path(directory) / f"{name}.ptrt").stat().st_size / fp32_size
            print(f"| {name} | {ppl:.3f} | {100 * (ppl / base - 1):+.2f}% | {share} | {size:.2f} |")
            texts[name] = greedy(module, PROMPT, 80)
    print(f"\nGreedy continuations of {PROMPT!r} ({CONTEXT}-character window):\n")
    for name, text in texts.items():
        print(f"- {name}: {text!r}")
    if args.no_latency:
        return
    print("\nOne forward call ([8, 64] tokens), ONNX Runtime CPU, 2 threads, fp32 fallback (median of 30):\n")
    one = calibration[0]
    timed = {"fp32": pipeline.convert(model, one, validate=False, ort_intra_op_threads=2)}
    for name, settings in (
        ("int4 (MatMulNBits, level 1)", {"precision": "int4"}),
        ("int4 (MatMulNBits, level 4)", {"precision": "int4", "ort_int4_accuracy_level": 4}),
    ):
        timed[name] = pipeline.convert(
            model, one, validate=False, quantize_fallback="fp32", ort_intra_op_threads=2, **settings
        )
    seconds = {name: latency(module, one) for name, module in timed.items()}
    for name, value in seconds.items():
        print(f"- {name}: {value * 1e3:.2f} ms ({seconds['fp32'] / value:.2f}x fp32)")


if __name__ == "__main__":
    main()
