"""A Whisper-base-shaped transcription, converted (encoder graph + cached decoder step, ONNX Runtime) against
PyTorch eager ``model.generate``: the same 48 tokens from the same features, medians of alternating runs.

The model is ``WhisperForConditionalGeneration`` with openai/whisper-base's shape (d_model 512, 6 + 6 layers, 8 heads,
80 mel bins, 3000 frames -> 1500 encoder states, vocabulary 51865) and random weights; nothing is downloaded. Both
systems decode exactly ``--tokens`` tokens (``min_new_tokens`` = ``max_new_tokens``), greedy, batch 1. Reports the
whole ``generate`` (encoder included), the encoder alone, and the per-token decode time (the difference divided by the
tokens), with the machine's load.

    python benchmarks/bench_seq2seq.py                   # 48 tokens, 1 thread, 5 rounds
    python benchmarks/bench_seq2seq.py --threads 2 --rounds 7
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
import tests_environment  # noqa: E402, F401 -- torchvision's operator schemas, before transformers imports it
import torch  # noqa: E402
import transformers  # noqa: E402

import pipeline  # noqa: E402

BASE = {
    "d_model": 512,
    "encoder_layers": 6,
    "decoder_layers": 6,
    "encoder_attention_heads": 8,
    "decoder_attention_heads": 8,
    "encoder_ffn_dim": 2048,
    "decoder_ffn_dim": 2048,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "vocab_size": 51865,
}


def timed(function: object, rounds: int) -> list[float]:
    """Seconds of ``rounds`` calls (after one warm-up call)."""
    assert callable(function)
    function()
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        out.append(time.perf_counter() - start)
    return out


@contextlib.contextmanager
def copied_cache() -> Iterator[None]:
    """The decoder step fed by copies of its cache (no bound runner): the form before the in-place cache."""
    from pipeline.runtime.generation import encoder_decoder

    kept = encoder_decoder.bound_runner
    encoder_decoder.bound_runner = lambda *_args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        encoder_decoder.bound_runner = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--validate", action="store_true", help="validate the conversion (minutes more)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**BASE)).eval()
    features = torch.randn(1, 80, 3000)
    options = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens}
    start = time.perf_counter()
    module = pipeline.convert(
        model,
        features,
        generation={"max_length": args.tokens + 8, "max_batch": 1},
        validate=args.validate,
        ort_intra_op_threads=args.threads,
        ort_allow_spinning=False,
    )
    converted = time.perf_counter() - start
    with torch.no_grad():
        expected = model.generate(features, **options)
    actual = module.generate(features, **options)
    same = torch.equal(actual[:, actual.shape[1] - expected.shape[1] :], expected)
    eager_runs: list[float] = []
    ours_runs: list[float] = []
    copied_runs: list[float] = []
    for _ in range(args.rounds):  # alternating, so that the machine's load falls on all three
        with torch.no_grad():
            eager_runs += timed(lambda: model.generate(features, **options), 1)
        ours_runs += timed(lambda: module.generate(features, **options), 1)
        with copied_cache():
            copied_runs += timed(lambda: module.generate(features, **options), 1)
    with torch.no_grad():
        eager_encoder = statistics.median(timed(lambda: model.get_encoder()(features), args.rounds))
    ours_encoder = statistics.median(timed(lambda: module.encoder(features), args.rounds))
    eager, ours = statistics.median(eager_runs), statistics.median(ours_runs)
    load = os.getloadavg()[0]
    shape = f"{args.tokens} tokens, batch 1, {args.threads} thread(s)"
    print(f"Whisper-base shape, random weights, {shape}, load {load:.1f}")
    print(f"conversion {converted:.1f} s (validate={args.validate}); same tokens as eager: {same}")
    print("| | generate (s) | encoder (s) | decode ms/token |")
    print("|---|---|---|---|")
    copied = statistics.median(copied_runs)
    rows = (
        ("PyTorch eager", eager, eager_encoder),
        ("converted (ONNX Runtime), cache in place", ours, ours_encoder),
        ("converted, cache copied in and out per step", copied, ours_encoder),
    )
    for name, whole, encoder in rows:
        print(f"| {name} | {whole:.3f} | {encoder:.3f} | {1000 * (whole - encoder) / args.tokens:.2f} |")
    print(f"speed-up: {eager / ours:.2f}x the whole generate ({eager / copied:.2f}x with the cache copied)")


if __name__ == "__main__":
    main()
