"""A Whisper-base-shaped transcription, converted (encoder graph + cached decoder step, ONNX Runtime) against
PyTorch eager ``model.generate``: the same 48 tokens from the same features, medians of alternating runs.

The model is ``WhisperForConditionalGeneration`` with openai/whisper-base's shape (d_model 512, 6 + 6 layers, 8 heads,
80 mel bins, 3000 frames -> 1500 encoder states, vocabulary 51865) and random weights; nothing is downloaded. Both
systems decode exactly ``--tokens`` tokens (``min_new_tokens`` = ``max_new_tokens``), greedy, batch 1. Reports the
whole ``generate`` (encoder included), the encoder alone, and the per-token decode time (the difference divided by the
tokens), with the machine's load. The same conversion with its encoder's attention decomposed (``MatMul``, ``Softmax``,
``MatMul``, as ``module.onnx`` has it) rather than ONNX Runtime's ``MultiHeadAttention`` runs alongside: the form
before that session-graph rewrite.

With ``--optimum PYTHON`` (the python of optimum-onnx's own venv: ``benchmarks/peers/optimum_worker.py`` says how to
make it), the peer a user would otherwise pick runs in the same rounds: the model saved as a checkpoint, exported by
optimum-onnx's ``ORTModelForSpeechSeq2Seq`` and decoding the same features in its worker process, on the same ONNX
Runtime (its wall time per call; its CPU time is the worker's, not counted here).

    python benchmarks/bench_seq2seq.py                   # 48 tokens, 1 thread, 5 rounds
    python benchmarks/bench_seq2seq.py --threads 2 --rounds 7
    python benchmarks/bench_seq2seq.py --optimum /work/bench-venvs/optimum/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
import numpy as np  # noqa: E402
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


def alternated(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, float]]:
    """The median wall and CPU seconds of each call over ``rounds`` rounds, the calls alternated within each round (so
    that the machine's load falls on all of them), after one warm-up call each. CPU seconds are this thread's: at one
    thread, the call's whole work (PyTorch and ONNX Runtime then run on the calling thread), less moved by other
    processes than the wall clock on a shared machine."""
    for call in calls.values():
        call()
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start, start_cpu = time.perf_counter(), time.thread_time()
            call()
            cpu[name].append(time.thread_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in calls}


def decomposed_encoder(module: Any) -> Any:
    """The same conversion with its encoder's session running the graph's decomposed attention (``MatMul``,
    ``Softmax``, ``MatMul``) rather than ``MultiHeadAttention`` (:mod:`pipeline.runtime.ort.multi_head_attention`):
    the form before that rewrite."""
    from unittest import mock

    from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule
    from pipeline.runtime.module import ConvertedModule
    from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

    encoder = module.encoder
    with mock.patch("pipeline.runtime.ort.session_graph.plain_attention", return_value=False):
        executor = OnnxRuntimeExecutor(encoder.onnx, encoder.io, encoder.settings)
    plain = ConvertedModule(executor, encoder.io, encoder.onnx, encoder.settings, encoder.report)
    return EncoderDecoderModule(plain, module.decoder)


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


def optimum_peer(python: Path, model: Any, features: torch.Tensor, threads: int, work: Path) -> tuple[Any, float]:
    """optimum-onnx's Whisper in its worker (``bench_generate.Optimum``'s process and protocol): ``model`` saved as a
    checkpoint in ``work``, exported, loaded with ``threads``; the worker and optimum's export seconds."""
    from bench_generate import Optimum

    checkpoint = work / "checkpoint"
    model.save_pretrained(checkpoint)
    np.save(work / "features.npy", features.numpy())
    peer = Optimum(python, checkpoint, work)
    kind = {"kind": "speech-seq2seq"}
    exported = peer.ask({"op": "export", "checkpoint": str(checkpoint), "out": str(peer.out), **kind})["seconds"]
    peer.ask({"op": "load", "dir": str(peer.out), "threads": threads, "spinning": False, **kind})
    return peer, float(exported)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--validate", action="store_true", help="validate the conversion (minutes more)")
    parser.add_argument("--optimum", type=Path, help="the python of optimum-onnx's venv: its Whisper in the rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        run(args, Path(work))


def run(args: argparse.Namespace, work: Path) -> None:
    """The benchmark (see the module docstring), the peer's files in ``work``."""
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
    before = decomposed_encoder(module)
    same = torch.equal(actual[:, actual.shape[1] - expected.shape[1] :], expected)
    same = same and torch.equal(before.generate(features, **options), actual)

    def copied() -> object:
        with copied_cache():
            return module.generate(features, **options)

    calls: dict[str, Callable[[], object]] = {
        "eager": lambda: model.generate(features, **options),
        "ours": lambda: module.generate(features, **options),
        "copied": copied,
        "before": lambda: before.generate(features, **options),
    }
    peer_note = ""
    if args.optimum is not None:
        peer, exported = optimum_peer(args.optimum, model, features, args.threads, work)
        request = {"op": "transcribe", "features": str(work / "features.npy"), "new_tokens": args.tokens}
        theirs = torch.tensor(peer.ask(request)["tokens"])
        width = min(theirs.shape[1], expected.shape[1])
        alike = torch.equal(theirs[:, -width:], expected[:, -width:])
        calls["optimum"] = lambda: peer.ask(request)
        versions = peer.ask({"op": "versions"})["versions"]
        peer_note = (
            f"optimum-onnx {versions['optimum-onnx']} (transformers {versions['transformers']}, ONNX Runtime "
            f"{versions['onnxruntime']}): export {exported:.1f} s; same tokens as eager: {alike}"
        )
    with torch.no_grad():
        whole = alternated(calls, args.rounds)
        encoders = alternated(
            {
                "eager": lambda: model.get_encoder()(features),
                "ours": lambda: module.encoder(features),
                "before": lambda: before.encoder(features),
            },
            args.rounds,
        )
    encoders["copied"] = encoders["ours"]
    load = os.getloadavg()[0]
    shape = f"{args.tokens} tokens, batch 1, {args.threads} thread(s)"
    print(f"Whisper-base shape, random weights, {shape}, load {load:.1f}")
    print(f"conversion {converted:.1f} s (validate={args.validate}); same tokens as eager: {same}")
    if peer_note:
        print(peer_note)
    print("| | generate (s) | encoder (s) | decode ms/token | generate, CPU (s) | encoder, CPU (s) |")
    print("|---|---|---|---|---|---|")
    names = {
        "eager": "PyTorch eager",
        "ours": "converted (ONNX Runtime), cache in place",
        "copied": "converted, cache copied in and out per step",
        "before": "converted, encoder's attention decomposed (before MultiHeadAttention)",
    }
    for key, name in names.items():
        (call, call_cpu), (encoder, encoder_cpu) = whole[key], encoders[key]
        decode = 1000 * (call - encoder) / args.tokens
        print(f"| {name} | {call:.3f} | {encoder:.3f} | {decode:.2f} | {call_cpu:.3f} | {encoder_cpu:.3f} |")
    if "optimum" in whole:
        print(f"| optimum-onnx ORTModelForSpeechSeq2Seq (its worker) | {whole['optimum'][0]:.3f} | | | | |")
    eager = whole["eager"]
    ratios = {key: (eager[0] / whole[key][0], eager[1] / whole[key][1]) for key in names}
    print(
        f"speed-up: {ratios['ours'][0]:.2f}x the whole generate (CPU time {ratios['ours'][1]:.2f}x); "
        f"{ratios['copied'][0]:.2f}x with the cache copied, {ratios['before'][0]:.2f}x with the encoder's attention "
        f"decomposed (CPU time {ratios['before'][1]:.2f}x)"
    )
    if "optimum" in whole:
        print(f"against optimum-onnx: {whole['optimum'][0] / whole['ours'][0]:.2f}x its whole generate")


if __name__ == "__main__":
    main()
