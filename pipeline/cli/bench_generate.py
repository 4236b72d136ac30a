"""``pipeline bench ARTIFACT --generate``: prefill and decode tokens per second of a generation artifact.

Each run decodes a batch of seeded random prompts (``--batch`` x ``--prompt-length`` ids) greedily for
``--new-tokens`` tokens, the end-of-sequence token ignored, through :meth:`GenerativeModule.stream`: the time to
the first new token is the prefill (the prompt through the step, and the first choice), the rest is the decode.
Prefill tokens/s = batch x prompt / prefill time; decode tokens/s = batch x (new - 1) / decode time; medians over
the runs, after warm-up runs. ``benchmarks/bench_generate.py`` measures PyTorch eager ``model.generate`` beside it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING, Any

from converters.errors import InputError

if TYPE_CHECKING:
    import torch

#: Runs and warm-up runs when ``--iterations`` / ``--warmup`` are not given (a run is a whole generation).
DEFAULT_RUNS, DEFAULT_WARMUP = 5, 1
#: Prompt tokens and new tokens when not given (each at most what fits the artifact's cache).
DEFAULT_TOKENS = 32


def add_generation_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """``bench``'s options for a generation artifact."""
    group = parser.add_argument_group("generation (--generate, a .ptrt from `pipeline convert ... --generation`)")
    group.add_argument("--generate", action="store_true", help="prefill and decode tokens/s of a generation artifact")
    group.add_argument(
        "--prompt-length", type=int, default=None, metavar="N", help="prompt tokens per row (32, or half max_length)"
    )
    group.add_argument(
        "--new-tokens", type=int, default=None, metavar="N", help="tokens generated per row (32, or what fits)"
    )
    group.add_argument("--batch", type=int, default=1, metavar="N", help="prompts decoded together (1)")


def bench_generation(args: argparse.Namespace, module: Any) -> dict[str, Any]:
    """The figures of ``module`` (a generation artifact, with the bench's thread settings) as JSON-ready data."""
    import torch

    runs = DEFAULT_RUNS if args.iterations is None else args.iterations
    warmup = DEFAULT_WARMUP if args.warmup is None else args.warmup
    capacity = module.generation.max_length
    if args.prompt_length is None:
        args.prompt_length = min(DEFAULT_TOKENS, capacity // 2)
    if args.new_tokens is None:
        args.new_tokens = min(DEFAULT_TOKENS, capacity - args.prompt_length)
    _check_sizes(module, args.batch, args.prompt_length, args.new_tokens)
    vocab = module.vocabulary_size or 2
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, vocab, (args.batch, args.prompt_length), generator=generator)
    for _ in range(warmup):
        time_generation(module, ids, args.new_tokens)
    times = [time_generation(module, ids, args.new_tokens) for _ in range(runs)]
    prefill = statistics.median(t[0] for t in times)
    decode = statistics.median(t[1] for t in times)
    return {
        "target": args.target,
        "batch": args.batch,
        "prompt_tokens": args.prompt_length,
        "new_tokens": args.new_tokens,
        "runs": runs,
        "warmup": warmup,
        "prefill_ms_median": prefill * 1e3,
        "decode_ms_per_step_median": decode * 1e3 / (args.new_tokens - 1),
        "prefill_tokens_per_s": args.batch * args.prompt_length / prefill,
        "decode_tokens_per_s": args.batch * (args.new_tokens - 1) / decode,
    }


def time_generation(module: Any, ids: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of one greedy generation of ``new_tokens`` tokens, eos ignored."""
    start = time.perf_counter()
    tokens = module.stream(ids, max_new_tokens=new_tokens, eos_token_id=[])
    next(tokens)
    first = time.perf_counter()
    for _ in tokens:
        pass
    return first - start, time.perf_counter() - first


def _check_sizes(module: Any, batch: int, prompt: int, new: int) -> None:
    generation = module.generation
    if batch < 1 or prompt < 1 or new < 2:
        raise InputError(
            f"--batch {batch}, --prompt-length {prompt}, --new-tokens {new}: a decode needs at least one row, one "
            "prompt token and two new tokens",
            fix="e.g. --batch 1 --prompt-length 32 --new-tokens 32",
        )
    if batch > generation.max_batch:
        raise InputError(
            f"--batch {batch}, but the artifact was converted for max_batch={generation.max_batch}",
            fix=f"pass --batch {generation.max_batch} or less, or convert with --generation max_batch={batch}",
        )
    if prompt + new > generation.max_length:
        raise InputError(
            f"--prompt-length {prompt} + --new-tokens {new} = {prompt + new} tokens, more than the cache holds "
            f"(max_length={generation.max_length})",
            fix=f"lower them, or convert with --generation max_length={prompt + new}",
        )


def generation_table(label: str, r: dict[str, Any]) -> str:
    """The figures of :func:`bench_generation` as ``pipeline bench`` prints them (``label``: what was timed)."""
    return "\n".join(
        [
            f"{label}: batch {r['batch']}, prompt {r['prompt_tokens']} tokens, {r['new_tokens']} new tokens "
            f"(greedy, eos ignored)",
            f"{'':10} {'median':>10} {'tokens/s':>10}",
            f"{'prefill':10} {r['prefill_ms_median']:8.2f}ms {r['prefill_tokens_per_s']:10,.1f}",
            f"{'decode':10} {r['decode_ms_per_step_median']:8.2f}ms {r['decode_tokens_per_s']:10,.1f}   (ms per step)",
            f"medians of {r['runs']} runs after {r['warmup']} warm-up run(s)",
        ]
    )
