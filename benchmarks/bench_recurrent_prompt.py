"""A recurrent model's prompt and generate: our prompt graph against the one-token step fed token by token, ONNX
Runtime GenAI and PyTorch eager.

The model is a random-weight hybrid from transformers, built here (nothing is downloaded): ``lfm2`` (hidden 512,
8 layers: 6 short-convolution layers and 2 attention layers, vocab 32000), ``nemotron_h`` (hidden 512, 8 layers:
Mamba-2, attention and MLP layers, chunk 64) or ``mamba`` (hidden 512, 8 Mamba layers, state 16: its prompt graph
takes a prompt's first 64 tokens, the rest go one at a time), fp32. Systems (``--systems``, default all; each round
runs them in turn so that the machine's noise hits all alike), each with ``--threads`` threads (default 2) and
spinning off:

- ``prompt_graph``: ``pipeline.convert(model, ids, generation={"max_length": L, "max_batch": 1, "max_prompt": 64},
  ort_intra_op_threads=T, ort_allow_spinning=False)`` (a prompt graph of 64 tokens per run:
  pipeline/generation/prompt_graph.py), ``module.generate(ids, max_new_tokens=n, eos_token_id=[])``;
- ``token_by_token``: the same with ``max_prompt=1`` (no prompt graph: a prompt of n tokens is n step runs);
- ``genai``: ONNX Runtime GenAI (benchmarks/bench_generate.py's ``GenAI``): the model saved with ``save_pretrained``
  beside a local word-level tokenizer, built by GenAI's builder (``python -m onnxruntime_genai.models.builder -i DIR
  -o OUT -p fp32 -e cpu``, in a child process), ``og.Model`` with ``T`` intra-op threads, spinning off and no eos
  token (``eos_token_id: []``: no system stops early), per call an ``og.Generator`` (search option ``max_length=L``,
  greedy), the prompt appended and ``generate_next_token`` n times. The model types GenAI's builder lacks (NemotronH)
  or any failure of its builder or runtime show as a failed row, with its message on stderr;
- ``eager``: transformers' ``model.generate`` (its chunked prefill, then its one-token decode),
  ``torch.set_num_threads(T)``, ``OMP_WAIT_POLICY=PASSIVE`` (set before torch loads, unless set already: torch's
  spinning off; spinning OpenMP threads on a shared machine made eager 7-9x slower).

``L`` is the prompt + 64 + ``--new`` for ours and GenAI. Per system: the time to the first new token (a call with
one new token: the prompt through the model) and a whole call of ``--new`` tokens, each a separate call from the
prompt (a collection before it, none inside), medians of ``--rounds`` after an untimed warm-up round; the decode
step (in the whole call, the first new token's arrival to the last's over ``--new`` - 1: a streamer's stamps, for
GenAI a stamp per ``generate_next_token``); whether the greedy tokens equal eager's; and once, the conversion (ours:
``pipeline.convert``; GenAI: the builder's process, its imports included, then ``og.Model``). Run from the
repository root::

    python benchmarks/bench_recurrent_prompt.py                       # lfm2, a prompt of 256 tokens, all systems
    python benchmarks/bench_recurrent_prompt.py --prompt 1024 --rounds 3 --systems prompt_graph,genai,eager
    python benchmarks/bench_recurrent_prompt.py --model nemotron_h --prompt 512 --rounds 3
    python benchmarks/bench_recurrent_prompt.py --model mamba --prompt 64 --systems prompt_graph,token_by_token,eager
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests"), str(HERE)]
# eager's spinning off: torch's OpenMP threads wait passively, read when torch loads (below). Measured on this
# 2-core machine under another job's load: eager's first token 2,204 ms spinning, 223-256 ms passive.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import tests_environment  # noqa: E402,F401  (torchvision's operator schemas, before transformers)
import torch  # noqa: E402
import transformers  # noqa: E402
from bench_generate import GenAI, StampingStreamer, quiet_gc, save_tokenizer  # noqa: E402

import pipeline  # noqa: E402

SYSTEMS = ("prompt_graph", "token_by_token", "genai", "eager")
#: a system's greedy generate: (prompt ids, new tokens, a streamer stamping each new token) -> prompt and new tokens
Generate = Callable[[torch.Tensor, int, StampingStreamer], torch.Tensor]
#: max_prompt of our two systems
PROMPT_RUN = {"prompt_graph": 64, "token_by_token": 1}


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
    if kind == "mamba":  # its prompt graph takes a prompt's first run only (its scan forgets a run's states)
        mamba = transformers.MambaConfig(vocab_size=32000, hidden_size=512, num_hidden_layers=8, state_size=16)
        return transformers.MambaForCausalLM(mamba).eval()
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


class NoEosGenAI(GenAI):
    """bench_generate's GenAI with no eos token (``eos_token_id: []``), as ours run with ``eos_token_id=[]``."""

    def config(self, precision: str, threads: int) -> Any:
        """The threads and spinning of bench_generate's config, and no eos token."""
        config = super().config(precision, threads)
        config.overlay(json.dumps({"model": {"eos_token_id": []}}))
        return config


def genai_system(model: torch.nn.Module, work: Path, threads: int, capacity: int, record: dict[str, Any]) -> Generate:
    """The model saved with a tokenizer, GenAI's fp32 CPU build and ``og.Model``; a greedy generate of it (the prompt
    and the new tokens, as ``model.generate`` returns them). ``record`` gets the times and the builder's command."""
    start = time.perf_counter()
    checkpoint = work / "checkpoint"
    model.save_pretrained(checkpoint)
    save_tokenizer(checkpoint)
    record["save_s"] = time.perf_counter() - start
    system = NoEosGenAI(checkpoint, work, {})
    try:
        built = system.build("fp32")
    except RuntimeError:
        record["command"] = (
            f"python -m onnxruntime_genai.models.builder -i {checkpoint} -o {work / 'genai_fp32'} "
            f"-p fp32 -e cpu -c {work / 'genai_cache'}"
        )
        raise
    record.update(command=built["command"], build_s=built["seconds"], ops=built["ops"])
    og_model, record["load_s"] = system.load("fp32", threads)
    og = system.og

    def generate(ids: torch.Tensor, new: int, streamer: StampingStreamer) -> torch.Tensor:
        streamer.put(ids)
        params = og.GeneratorParams(og_model)
        params.set_search_options(max_length=capacity, do_sample=False, batch_size=ids.shape[0])
        generator = og.Generator(og_model, params)
        generator.append_tokens(ids.numpy().astype(np.int32))
        tokens = []
        for _ in range(new):
            if generator.is_done():
                break
            generator.generate_next_token()
            tokens.append(torch.from_numpy(generator.get_next_tokens().astype(np.int64)))
            streamer.put(tokens[-1])
        return torch.cat([ids, torch.stack(tokens, dim=1)], dim=1)

    return generate


def ours(
    model: torch.nn.Module, ids: torch.Tensor, name: str, threads: int, capacity: int, record: dict[str, Any]
) -> Generate:
    """``pipeline.convert`` with the system's ``max_prompt`` (timed); its greedy generate, no eos token."""
    generation = {"max_length": capacity, "max_batch": 1, "max_prompt": PROMPT_RUN[name]}
    start = time.perf_counter()
    module: Any = pipeline.convert(
        model, ids, generation=generation, validate=False, ort_intra_op_threads=threads, ort_allow_spinning=False
    )
    record["build_s"] = time.perf_counter() - start
    return lambda prompt, new, streamer: module.generate(prompt, max_new_tokens=new, eos_token_id=[], streamer=streamer)


def eager(model: torch.nn.Module) -> Generate:
    """transformers' greedy ``generate``, no eos token."""

    def generate(ids: torch.Tensor, new: int, streamer: StampingStreamer) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(
                ids, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0, streamer=streamer
            )

    return generate


def failure(error: BaseException) -> str:
    """The error's last line (the builder's failure: the last line of its stderr), printed whole on stderr."""
    traceback.print_exception(error, file=sys.stderr)
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:160]


def measure(
    calls: dict[str, Generate],
    ids: torch.Tensor,
    new: int,
    rounds: int,
    failed: dict[str, str],
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]], dict[str, torch.Tensor]]:
    """Each system in turn per round (round 0 warms up, untimed): a call for the first token, then a whole one."""
    first: dict[str, list[float]] = {name: [] for name in calls}
    whole: dict[str, list[float]] = {name: [] for name in calls}
    step: dict[str, list[float]] = {name: [] for name in calls}
    tokens: dict[str, torch.Tensor] = {}
    for round_ in range(rounds + 1):
        for name, call in calls.items():
            if name in failed:
                continue
            try:
                with quiet_gc():
                    start = time.perf_counter()
                    call(ids, 1, StampingStreamer())
                    middle = time.perf_counter()
                with quiet_gc():
                    middle_again = time.perf_counter()
                    streamer = StampingStreamer()
                    tokens[name] = call(ids, new, streamer)
                    end = time.perf_counter()
            except Exception as error:  # noqa: BLE001 -- the row says failed, the other systems go on
                failed[name] = failure(error)
                continue
            if round_ > 0:
                first[name].append(middle - start)
                whole[name].append(end - middle_again)
                if len(streamer.stamps) == new > 1:
                    step[name].append((streamer.stamps[-1] - streamer.stamps[0]) / (new - 1))
    return first, whole, step, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("lfm2", "nemotron_h", "mamba"), default="lfm2")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (default 256)")
    parser.add_argument("--new", type=int, default=32, help="new tokens of the whole generate (default 32)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="threads of every system (default 2)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {','.join(SYSTEMS)}")
    parser.add_argument("--work", type=Path, help="GenAI's checkpoint and build here (default: a temporary folder)")
    args = parser.parse_args()
    chosen = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SYSTEMS))
    if unknown or not chosen:
        parser.error(f"--systems {args.systems}: {unknown or 'none'} not among {','.join(SYSTEMS)}")
    torch.set_num_threads(args.threads)
    model = hybrid(args.model)
    ids = torch.randint(3, 31000, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    capacity = args.prompt + 64 + args.new
    calls: dict[str, Generate] = {}
    records: dict[str, dict[str, Any]] = {name: {} for name in chosen}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench_recurrent_prompt_") as temporary:
        work = args.work or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        for name in chosen:
            try:
                if name == "genai":
                    calls[name] = genai_system(model, work, args.threads, capacity, records[name])
                elif name == "eager":
                    calls[name] = eager(model)
                else:
                    calls[name] = ours(model, ids, name, args.threads, capacity, records[name])
            except Exception as error:  # noqa: BLE001 -- a failed row, the other systems go on
                failed[name] = failure(error)
                calls[name] = eager(model)  # a placeholder, never called
            print(f"{name}: {records[name]}" + (f", failed: {failed[name]}" if name in failed else ""), flush=True)
        first, whole, step, tokens = measure(calls, ids, args.new, args.rounds, failed)
    report(args, chosen, records, failed, first, whole, step, tokens)


def report(
    args: argparse.Namespace,
    chosen: list[str],
    records: dict[str, dict[str, Any]],
    failed: dict[str, str],
    first: dict[str, list[float]],
    whole: dict[str, list[float]],
    step: dict[str, list[float]],
    tokens: dict[str, torch.Tensor],
) -> None:
    """The table (medians), then every round's times."""
    print(
        f"\n{args.model}, a prompt of {args.prompt} tokens, batch 1, {args.threads} threads, spinning off, "
        f"medians of {args.rounds} rounds ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}):\n"
    )
    print(f"| system | conversion | first token | generate, {args.new} new | decode step | greedy = eager |")
    print("|---|---|---|---|---|---|")
    reference = tokens.get("eager")
    for name in chosen:
        record = records[name]
        built = (
            f"{record['build_s']:.1f} s" + (f" + load {record['load_s']:.2f} s" if "load_s" in record else "")
            if "build_s" in record
            else ""
        )
        if name in failed:
            print(f"| {name} | {built} | failed: {failed[name]} | | | |")
            continue
        same = "" if name == "eager" else "n/a" if reference is None else "no"
        if reference is not None and name != "eager":
            made, want = tokens[name], reference
            if made.shape == want.shape and torch.equal(made, want):
                same = "yes"
            else:
                agree = int((made[0, args.prompt :][: want.shape[1] - args.prompt] == want[0, args.prompt :]).sum())
                same = f"no ({agree}/{want.shape[1] - args.prompt} equal)" if made.shape[1] > args.prompt else "no"
        print(
            f"| {name} | {built} | {statistics.median(first[name]) * 1e3:.0f} ms | "
            f"{statistics.median(whole[name]):.3f} s | {statistics.median(step[name] or [0.0]) * 1e3:.1f} ms | {same} |"
        )
    print()
    for name in chosen:
        if name not in failed:
            print(
                f"{name}: first token ms {[round(x * 1e3) for x in first[name]]}, generate s "
                f"{[round(x, 3) for x in whole[name]]}, decode step ms {[round(x * 1e3, 1) for x in step[name]]}"
            )
    if "genai" in records and "command" in records["genai"]:
        print(f"genai: {records['genai']['command']}")


if __name__ == "__main__":
    main()
