"""Generation speed on ONNX Runtime's CPU provider against PyTorch eager ``model.generate`` with its cache.

Per model size (random-weight Llama configs) and batch (1 and 4): prefill tokens/s (the prompt through the step)
and decode tokens/s (new tokens after the first) for PyTorch eager ``model.generate`` (greedy, its DynamicCache),
the converted cached step with the cache in bound ``OrtValue`` buffers (aliased in place), the same step with a
copy of the cache per step (:class:`~pipeline.runtime.generation.runners.CopyingRunner`), and the no-cache conversion
(the plain forward, the whole sequence recomputed per token). Medians of ``--runs``, measured side by side, with
the same number of threads on both sides and ONNX Runtime's threads not spinning between calls.

Run from the repository root::

    python benchmarks/bench_generate.py                   # small and medium, batch 1 and 4
    python benchmarks/bench_generate.py --sizes small --runs 3 --threads 1
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# the repository first: with an editable install tests/pipeline (a test folder, no __init__) would otherwise be
# taken as a namespace package `pipeline` before the install's finder is asked
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
import tests_environment  # noqa: E402, F401 -- torchvision's operator schemas, before transformers imports it
import torch  # noqa: E402
import transformers  # noqa: E402

import pipeline  # noqa: E402
from pipeline.runtime.generation.layout import cache_layout
from pipeline.runtime.generation.module import GenerativeModule  # noqa: E402
from pipeline.runtime.generation.runners import CopyingRunner

SIZES = {
    "small": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8},
    "medium": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8},
}
PROMPT, NEW = 32, 32


def _median(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _step_times(
    module: pipeline.runtime.generation.module.GenerativeModule, ids: torch.Tensor, runs: int
) -> tuple[float, float]:
    """(prefill seconds, whole generate seconds) of the converted step."""
    runner = module.runner()
    batch = ids.shape[0]
    mask = torch.zeros(batch, module.generation.max_length, dtype=torch.int64)
    mask[:, :PROMPT] = 1
    positions = torch.arange(PROMPT).expand(batch, -1).contiguous()

    def prefill() -> None:
        runner.start(batch)
        runner.run(ids, mask, positions, 0)

    return _median(prefill, runs), _median(lambda: module.generate(ids, max_new_tokens=NEW, eos_token_id=[]), runs)


def bench_size(name: str, runs: int) -> list[str]:
    """The table rows of one model size."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=4096, num_key_value_heads=4, max_position_embeddings=256, **SIZES[name]
    )
    model = transformers.LlamaForCausalLM(config).eval()
    sample = torch.randint(0, 4096, (2, PROMPT))
    # the same threads on both sides, and ONNX Runtime's threads do not spin between calls: spinning threads take
    # the cores eager PyTorch needs right after each ONNX Runtime call (as `pipeline bench` does)
    fair = {"ort_intra_op_threads": torch.get_num_threads(), "ort_allow_spinning": False, "validate": False}
    step = pipeline.convert(model, sample[:1], generation={"max_length": PROMPT + NEW, "max_batch": 4}, **fair)
    plain = pipeline.convert(
        model, sample, dynamic={"input_ids": {0: ("batch", 1, 2, 4), 1: ("seq", 2, 32, PROMPT + NEW)}}, **fair
    )
    copying = GenerativeModule(step._executor, step.io, step.onnx, step.settings, step.report)
    copying._runner = CopyingRunner(step._executor, cache_layout(step.io, step.generation.layers))
    rows = []
    for batch in (1, 4):
        rows += _rows(name, model, step, copying, plain, torch.randint(0, 4096, (batch, PROMPT)), runs)
    return rows


def _rows(
    name: str,
    model: torch.nn.Module,
    step: GenerativeModule,
    copying: GenerativeModule,
    plain: pipeline.ConvertedModule,
    ids: torch.Tensor,
    runs: int,
) -> list[str]:
    """The rows of one batch size."""
    batch = ids.shape[0]
    rows = []
    with torch.no_grad():
        eager_prefill = _median(lambda: model(ids), runs)
        eager_total = _median(
            lambda: model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0),
            runs,
        )

    def no_cache() -> None:
        tokens = ids
        for _ in range(NEW):
            tokens = torch.cat([tokens, plain(tokens).logits[:, -1].argmax(-1, keepdim=True)], dim=1)

    plain_prefill = _median(lambda: plain(ids), runs)
    plain_total = _median(no_cache, runs)
    results = {
        "PyTorch eager generate (cache)": (eager_prefill, eager_total),
        "converted step, cache bound in place": _step_times(step, ids, runs),
        "converted step, cache copied per step": _step_times(copying, ids, runs),
        "no-cache conversion (prefix recomputed)": (plain_prefill, plain_total),
    }
    eager_decode = (NEW - 1) * batch / (eager_total - eager_prefill)
    for what, (prefill, total) in results.items():
        decode = (NEW - 1) * batch / max(total - prefill, 1e-9)
        cells = [
            name,
            batch,
            what,
            f"{PROMPT * batch / prefill:,.0f}",
            f"{decode:,.0f}",
            f"{decode / eager_decode:.2f}x",
        ]
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return rows


def main() -> None:
    """Print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads of PyTorch and ONNX Runtime alike (default: PyTorch's); "
        "on a busy machine use 1: multi-threaded PyTorch waits for descheduled threads at every op",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = ["| size | batch | runner | prefill tok/s | decode tok/s | decode vs eager |", "|---|---|---|---|---|---|"]
    for name in args.sizes:
        rows += bench_size(name, args.runs)
        print("\n".join(rows), flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load = os.getloadavg()[0]
    print(
        f"peak RSS {peak:.0f} MiB; torch and ONNX Runtime threads {torch.get_num_threads()} (no spinning); "
        f"load {load:.1f} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
