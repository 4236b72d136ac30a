"""A recurrent model's prompt: its prompt graph against the one-token step fed token by token, and PyTorch eager.

The model is a random-weight hybrid from transformers, built here (nothing is downloaded): ``lfm2`` (hidden 512,
8 layers: 6 short-convolution layers and 2 attention layers, vocab 32000) or ``nemotron_h`` (hidden 512, 8 layers:
Mamba-2, attention and MLP layers, chunk 64), fp32. Systems, each round running them in turn so that the machine's
noise hits all alike:

- ``prompt graph``: ``pipeline.convert(model, ids, generation={"max_length": L, "max_batch": 1, "max_prompt": 64})``
  (a prompt graph of 64 tokens per run: pipeline/generation/prompt_graph.py);
- ``token by token``: the same with ``max_prompt=1`` (no prompt graph: a prompt of n tokens is n step runs);
- ``eager``: transformers' ``model.generate`` (its chunked prefill, then its one-token decode).

Per system: the time to the first new token (``max_new_tokens=1``: the prompt through the model) and a whole
``generate`` of ``--new`` tokens, medians of ``--rounds``; and whether the greedy tokens equal eager's. Run from the
repository root::

    python benchmarks/bench_recurrent_prompt.py                       # lfm2, a prompt of 256 tokens
    python benchmarks/bench_recurrent_prompt.py --model nemotron_h --prompt 512 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]

import tests_environment  # noqa: E402,F401  (torchvision's operator schemas, before transformers)
import torch  # noqa: E402
import transformers  # noqa: E402

import pipeline  # noqa: E402


def hybrid(kind: str) -> torch.nn.Module:
    """A random-weight hybrid of about 40M parameters (most in the embeddings)."""
    torch.manual_seed(0)
    if kind == "lfm2":
        types = ["conv", "conv", "conv", "full_attention", "conv", "conv", "conv", "full_attention"]
        config = transformers.Lfm2Config(
            vocab_size=32000,
            hidden_size=512,
            intermediate_size=1408,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            layer_types=types,
            max_position_embeddings=4096,
        )
        return transformers.Lfm2ForCausalLM(config).eval()
    config = transformers.NemotronHConfig(
        vocab_size=32000,
        hidden_size=512,
        num_hidden_layers=8,
        layer_types=["mamba", "mlp", "mamba", "attention", "mamba", "mlp", "mamba", "mlp"],
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        mamba_num_heads=16,
        mamba_head_dim=64,
        ssm_state_size=64,
        n_groups=2,
        chunk_size=64,
        intermediate_size=1408,
    )
    return transformers.NemotronHForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("lfm2", "nemotron_h"), default="lfm2")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (default 256)")
    parser.add_argument("--new", type=int, default=32, help="new tokens of the whole generate (default 32)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = hybrid(args.model)
    ids = torch.randint(3, 31000, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    capacity = args.prompt + 64 + args.new
    systems: dict[str, object] = {}
    for name, prompt in (("prompt graph", 64), ("token by token", 1)):
        start = time.perf_counter()
        generation = {"max_length": capacity, "max_batch": 1, "max_prompt": prompt}
        systems[name] = pipeline.convert(model, ids, generation=generation, validate=False)
        print(f"converted ({name}) in {time.perf_counter() - start:.1f} s", flush=True)

    def eager(new: int) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)

    calls = {name: module.generate for name, module in systems.items()}  # type: ignore[attr-defined]
    first: dict[str, list[float]] = {name: [] for name in (*calls, "eager")}
    whole: dict[str, list[float]] = {name: [] for name in first}
    tokens: dict[str, torch.Tensor] = {}
    for _ in range(args.rounds + 1):  # the first round warms up, untimed
        for name in first:
            run = eager if name == "eager" else (lambda new, c=calls[name]: c(ids, max_new_tokens=new, eos_token_id=[]))
            start = time.perf_counter()
            run(1)
            middle = time.perf_counter()
            tokens[name] = run(args.new)
            end = time.perf_counter()
            first[name].append(middle - start)
            whole[name].append(end - middle)
    print(f"\n{args.model}, a prompt of {args.prompt} tokens, batch 1, 2 threads, medians of {args.rounds} rounds:\n")
    print("| system | first token | generate, %d new | greedy = eager |" % args.new)
    print("|---|---|---|---|")
    for name in first:
        same = "yes" if torch.equal(tokens[name], tokens["eager"]) else "no"
        print(
            f"| {name} | {statistics.median(first[name][1:]) * 1e3:.0f} ms | "
            f"{statistics.median(whole[name][1:]):.3f} s | {same} |"
        )


if __name__ == "__main__":
    main()
