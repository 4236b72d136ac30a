"""INT4 decode speed on ONNX Runtime's CPU provider: a Llama-style causal LM (random weights, width 256, 4 layers)
converted as one cached decoder step (the generation path, ``generation=``), greedy-decoding 64 new tokens at batch
1: tokens/s of fp32, fp16 (the float32 emulation on the CPU) and INT4 (W4A16, fp32 fallback; MatMulNBits at accuracy
level 1, exact, and 4), medians of 3 runs, 2 threads.

    python benchmarks/bench_int4_decode.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# the repository first: with an editable install tests/pipeline (a test folder, no __init__) would otherwise be
# taken as a namespace package `pipeline` before the install's finder is asked
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(ROOT / "tests"))

import tests_environment  # noqa: E402,F401 -- torchvision's operator schemas before transformers imports it
import transformers  # noqa: E402

import pipeline  # noqa: E402

VARIANTS = {
    "fp32": {},
    "fp16": {"precision": "fp16"},
    "int4 (level 1)": {"precision": "int4", "quantize_fallback": "fp32"},
    "int4 (level 4)": {"precision": "int4", "quantize_fallback": "fp32", "ort_int4_accuracy_level": 4},
}


def main() -> None:
    """Convert each variant, decode, print tokens/s."""
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=511,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 500, (1, 16), generator=torch.Generator().manual_seed(0))
    rates = {}
    for name, settings in VARIANTS.items():
        module = pipeline.convert(
            model,
            ids,
            generation={"max_length": 96, "max_batch": 1},
            validate=False,
            ort_intra_op_threads=2,
            **settings,
        )
        module.generate(ids, max_new_tokens=4)
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            module.generate(ids, max_new_tokens=64)
            runs.append(64 / (time.perf_counter() - start))
        rates[name] = statistics.median(runs)
        print(f"{name}: {rates[name]:.1f} tokens/s ({rates[name] / rates['fp32']:.2f}x fp32)", flush=True)


if __name__ == "__main__":
    main()
