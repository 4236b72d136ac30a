"""Which transformers decoder families generate token-identically after ``convert(..., generation=...)``.

For each family (a tiny random-weight config: 2 layers, hidden 64, grouped KV heads where the family has them):
convert the cached step on ONNX Runtime (fp32, validated against PyTorch), then greedy-decode 32 new tokens for one
prompt and for a left-padded batch of 3, and count the tokens equal to transformers' own ``model.generate`` (eos
off, so both run the full length). Also: whether the model's attention became ONNX ``Attention`` (families that
dispatch through transformers' ``AttentionInterface``), how many RMSNorm / RoPE subgraphs became the opset-23 ops,
and whether TensorRT-RTX builds the step (``--rtx``). ``--fp16`` converts each family once more with
``precision="fp16"``: whether the conversion's decoding validation passes the accuracy policy (per-step logits
against transformers' generate, judged as float16) and how many of the 32 greedy tokens of the single prompt equal
PyTorch fp32 ``model.generate``'s.

Run from the repository root::

    python benchmarks/generation_families.py                  # every family, the markdown table
    python benchmarks/generation_families.py --only llama gpt2
    python benchmarks/generation_families.py --json families.json
    python benchmarks/generation_families.py --rtx --fp16 llama qwen2 gemma phi3 gpt-2 gpt-neox  # fp16 for these
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the repository first: with an editable install tests/pipeline (a test folder, no __init__) would otherwise be
# taken as a namespace package `pipeline` before the install's finder is asked
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
import tests_environment  # noqa: E402, F401 -- torchvision's operator schemas, before transformers imports it
import torch  # noqa: E402
import transformers as tf  # noqa: E402

import pipeline  # noqa: E402

NEW_TOKENS = 32
VOCAB = 96
_COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
_GQA = {**_COMMON, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}


def _families() -> dict[str, Callable[[], Any]]:
    """Family name -> a tiny config (random weights)."""
    return {
        "Llama": lambda: tf.LlamaConfig(**_GQA),
        "Mistral": lambda: tf.MistralConfig(**_GQA, sliding_window=8),
        "Qwen2": lambda: tf.Qwen2Config(**_GQA),
        "Qwen3": lambda: tf.Qwen3Config(**_GQA, head_dim=16),
        "Gemma": lambda: tf.GemmaConfig(**_GQA, head_dim=16),
        "Gemma2": lambda: tf.Gemma2Config(**_GQA, head_dim=16, sliding_window=8),
        "Gemma3": lambda: tf.Gemma3TextConfig(**_GQA, head_dim=16, sliding_window=8),
        "Phi": lambda: tf.PhiConfig(**_GQA),
        "Phi3": lambda: tf.Phi3Config(**_GQA, pad_token_id=0),
        "GPT-2": lambda: tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128),
        "GPT-NeoX": lambda: tf.GPTNeoXConfig(**{**_COMMON, "num_attention_heads": 4}, max_position_embeddings=128),
        "GPT-J": lambda: tf.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=128),
        "OPT": lambda: tf.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=64,
            max_position_embeddings=128,
        ),
        "Falcon": lambda: tf.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
        "BLOOM": lambda: tf.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4),
        "StableLM": lambda: tf.StableLmConfig(**_GQA),
        "OLMo2": lambda: tf.Olmo2Config(**_GQA),
        "Granite": lambda: tf.GraniteConfig(**_GQA),
        "Cohere": lambda: tf.CohereConfig(**_GQA),
        "SmolLM3": lambda: tf.SmolLM3Config(**_GQA),
        **_recurrent_families(),
    }


#: Families whose cache layers keep recurrent states (pipeline/generation/recurrent_state.py): model type -> the
#: layer_types of their two layers (None: the small config's own), a recurrent layer and, where the family has one,
#: an attention layer (transformers' own forward fails on a cache of linear-attention layers alone for some).
_RECURRENT = {
    "qwen3_next": ["linear_attention", "full_attention"],
    "qwen3_5_text": ["linear_attention", "full_attention"],
    "qwen3_5_moe_text": ["linear_attention", "full_attention"],
    "lfm2": ["conv", "full_attention"],
    "lfm2_moe": ["conv", "full_attention"],
    "falcon_h1": None,
    "jamba": None,
    "mamba": None,
    "mamba2": None,
    "falcon_mamba": None,
    "olmo_hybrid": None,
    "nemotron_h": None,
    "lara_mini": None,
}


def _recurrent_families() -> dict[str, Callable[[], Any]]:
    """The recurrent-state families, each the small config of tests/model_sources (vocabulary as the others')."""

    def make(kind: str) -> Any:
        from model_sources import transformers_all_models as every

        config = every.shrunk(kind)
        if _RECURRENT[kind] is not None:
            config.layer_types = _RECURRENT[kind]
        return config

    return {kind: (lambda kind=kind: make(kind)) for kind in _RECURRENT}


def _prompts() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    single = torch.randint(3, VOCAB, (1, 7), generator=generator)
    batch = torch.randint(3, VOCAB, (3, 9), generator=generator)
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    mask[2, :1] = 0
    return single, batch.masked_fill(mask == 0, 0), mask


def run_family(
    name: str, make_config: Callable[[], Any], rtx: bool, fp16: bool = False, max_prompt: int | None = None
) -> dict[str, Any]:
    """Convert one family's cached step and count identical greedy tokens (batch 1 and left-padded 3); ``max_prompt``:
    the generation setting (a recurrent family's prompt graph's tokens per run)."""
    row: dict[str, Any] = {"family": name}
    torch.manual_seed(0)
    config = make_config()
    config.pad_token_id = 0
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    # eos off on both sides: generate(eos_token_id=None) falls back to the generation config's eos (OPT's default 2
    # is a token its random weights like, so transformers stopped early and the rows looked divergent)
    model.generation_config.eos_token_id = None
    single, batch, mask = _prompts()
    start = time.perf_counter()
    generation = {"max_length": 48, "max_batch": 3, **({"max_prompt": max_prompt} if max_prompt else {})}
    module = pipeline.convert(model, single, generation=generation, validation_inputs=1)
    row["convert_s"] = round(time.perf_counter() - start, 1)
    prompt_graph = getattr(module, "prompt_graph", None)
    if prompt_graph is not None:
        row["prompt_graph"] = module.generation.prompt_tokens
    ops = collections.Counter(n.op_type for n in module.onnx.graph.node)
    row["attention_op"] = ops["Attention"] > 0
    row["tensor_scatter"] = ops["TensorScatter"]
    row["rms_normalization"] = ops["RMSNormalization"]
    row["rotary_embedding"] = ops["RotaryEmbedding"]
    options = {"max_new_tokens": NEW_TOKENS, "eos_token_id": [], "pad_token_id": 0}
    theirs = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    expected = model.generate(single, **theirs)[:, -NEW_TOKENS:]
    row["batch1"] = int((module.generate(single, **options)[:, -NEW_TOKENS:] == expected).sum())
    expected = model.generate(batch, attention_mask=mask, **theirs)[:, -NEW_TOKENS:]
    got = module.generate(batch, mask, **options)[:, -NEW_TOKENS:]
    row["batch3"] = [int(r) for r in (got == expected).sum(dim=1)]
    if fp16:
        row.update(_fp16_row(model, single, rtx))
    elif rtx:
        from pipeline.precision.buildable import build_error

        # the step (a prompt graph converted for ONNX Runtime attends with ONNX Attention over several queries, which
        # TensorRT-RTX has no float32 kernel for: the fp16 rows convert for TensorRT-RTX and build both graphs)
        error = build_error(module.onnx, module.settings.dynamic)
        row["rtx_builds"] = error is None
        row["rtx_error"] = None if error is None else error.splitlines()[0][:160]
    return row


def _fp16_row(model: Any, single: torch.Tensor, rtx: bool) -> dict[str, Any]:
    """The fp16 conversion: the decoding validation's verdict (the accuracy policy) and the greedy tokens of the
    single prompt identical to PyTorch fp32 generate (counted by the validation itself). With ``rtx``, converted for
    TensorRT-RTX (one engine, the context and generation profiles, built here) and validated on ONNX Runtime beside
    the engine (the float16 graph itself, not the CPU emulation ONNX Runtime as the backend runs)."""
    import warnings

    from converters.errors import AccuracyError, PipelineError

    generation = {"max_length": 48, "max_batch": 3, "max_prompt": 16}
    target = {"backend": "tensorrt-rtx", "trt_engine_cache": False} if rtx else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the engine cannot run here: said once in the table
            module = pipeline.convert(
                model, single, generation=generation, precision="fp16", validation_inputs=1, **target
            )
    except AccuracyError as error:
        return {"fp16_policy": f"FAIL: {' '.join(str(error).split())[:160]}"}
    except PipelineError as error:
        return {"fp16_policy": f"{type(error).__name__}: {' '.join(str(error).split())[:160]}"}
    decoding = module.report.accuracy.decoding
    worst = decoding.worst_step
    row = {
        "fp16_policy": "pass",
        "fp16_greedy": f"{decoding.greedy}/{decoding.greedy_tokens}",
        "fp16_worst": f"step {worst.step}: RMS error {worst.relative_rms:.1e} x RMS",
    }
    if rtx:
        # the context and generation profiles of a step that takes several tokens; one profile (the batch) for a
        # recurrent step, whose one token leaves no sequence axis (pipeline/generation/recurrent_state.py)
        several = any(d.name == "sequence" for d in module.settings.dynamic)
        row["rtx_builds"] = bool(module.engine_bytes) and len(module.settings.profiles) == (2 if several else 0)
        prompt_graph = getattr(module, "prompt_graph", None)
        if prompt_graph is not None:  # a recurrent family's prompt graph: built too
            row["prompt_graph"] = module.generation.prompt_tokens
            row["rtx_builds"] = row["rtx_builds"] and bool(prompt_graph.engine_bytes)
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README table."""
    fp16 = any("fp16_policy" in r for r in rows)
    head = "| family | tokens identical, batch 1 | left-padded batch 3 (per row) | ONNX Attention |"
    head += " RMSNorm / RoPE ops |"
    head += " fp16 greedy identical | fp16 per-step logits (policy) |" if fp16 else ""
    rtx = any("rtx_builds" in r for r in rows)
    head += " TensorRT-RTX builds (context and generation profiles; one for a one-token step) |" if rtx else ""
    lines = [head + " convert s |", "|---" * (head.count("|")) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['family']} | error: {r['error']} | | | |")
            continue
        rows3 = " / ".join(str(n) for n in r["batch3"])
        attention = "yes" if r["attention_op"] else "no (model's own attention)"
        cells = [r["family"], f"{r['batch1']}/{NEW_TOKENS}", f"{rows3} (of {NEW_TOKENS})", attention]
        cells.append(f"{r.get('rms_normalization', 0)} / {r.get('rotary_embedding', 0)}")
        if fp16:
            policy = r.get("fp16_policy", "")
            cells += [r.get("fp16_greedy", "-"), f"{policy}, worst {r['fp16_worst']}" if "fp16_worst" in r else policy]
        if rtx:
            cells.append({True: "yes", False: "no"}.get(r.get("rtx_builds"), "-"))
        cells.append(r["convert_s"])
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    """Run the families and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="family names (case-insensitive)")
    parser.add_argument(
        "--rtx", action="store_true", help="also build each step with TensorRT-RTX (with --fp16: the fp16 conversion)"
    )
    parser.add_argument(
        "--fp16", nargs="*", help="also convert in fp16 (these families; none named: all): policy verdict, greedy count"
    )
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument(
        "--max-prompt",
        type=int,
        help="generation max_prompt of the fp32 conversions (a recurrent family's prompt graph: 8 runs its prompts in "
        "whole runs within the 48 positions; default: the setting's default, too long to leave room for 32 tokens)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    wanted = {n.lower() for n in args.only or ()}
    rows = []
    for name, make in _families().items():
        if wanted and name.lower() not in wanted:
            continue
        try:
            fp16 = args.fp16 is not None and (not args.fp16 or name.lower() in {n.lower() for n in args.fp16})
            row = run_family(name, make, args.rtx and (fp16 or args.fp16 is None), fp16, args.max_prompt)
        except Exception as exc:  # noqa: BLE001 - a family that fails is a row of the table, with its reason
            traceback.print_exc()
            row = {"family": name, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
