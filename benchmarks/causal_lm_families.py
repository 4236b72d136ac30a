"""Which transformers causal-LM families generate token-identically after ``convert(..., generation=...)``: every
model type transformers maps to a causal LM, not a list we wrote.

    python benchmarks/causal_lm_families.py --jsonl causal_lm.jsonl                      # every type, fp32
    python benchmarks/causal_lm_families.py --only llama mamba --jsonl causal_lm.jsonl  # these types
    python benchmarks/causal_lm_families.py --precision fp16 --jsonl causal_lm16.jsonl

The families are the types of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (their causal-LM class), each built
by the every-type source's shrinker (``tests/model_sources/transformers_all_build.py``: 2 layers, width 32, small
vocabulary, each repair it needs), its matrices drawn wider (greedy tokens vary) and eos off (every row decodes every
token). The sample is a batch of 2 prompts of 9 random token ids, the second left-padded by 2 (masked, the pad id).
Each family runs in a process of its own (``--timeout`` seconds; a crash or a hang is its row). A row: converted with
``generation={"max_length": 64, "max_batch": 8}`` on ONNX Runtime, validated (its decoding checked against the model's
own ``generate``); greedy tokens (8 new) and beam search (4 beams) compared with ``model.generate``; every greedy
step's scores (the goal: within 1e-3 in fp32); the artifact saved and loaded; TensorRT-RTX's real builder building
every graph ahead of time (converted again for it, unless ``--no-rtx``). A type transformers' own model or
``generate`` fails on from the small config is "cannot run eagerly", with transformers' message.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import tests_environment  # noqa: E402, F401 -- torchvision's operator schemas, before transformers imports it
import torch  # noqa: E402
import transformers  # noqa: E402
from family_sweep import (  # noqa: E402
    PRECISIONS,
    CannotRunEagerly,
    eager_tokens,
    first_line,
    quiet,
    resumed_rows,
    row_of,
    rtx_builds,
    score_cell,
    scores_clause,
    scores_gap,
)
from model_sources import transformers_all_models as every  # noqa: E402
from transformers.generation.utils import GenerationMixin  # noqa: E402

import pipeline  # noqa: E402

NEW_TOKENS = 8
BEAMS = 4
BATCH = 2
PROMPT = 9
PAD = 2  # the second prompt's left padding
GENERATION = {"max_length": 64, "max_batch": BATCH * BEAMS}
GREEDY = {"max_new_tokens": NEW_TOKENS, "do_sample": False}
RTX = True  # --no-rtx: no TensorRT-RTX build


def families() -> dict[str, str]:
    """model type -> its causal-LM class, from transformers' mapping (the types transformers' config mapping has)."""
    from transformers.models.auto import modeling_auto

    names = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    known = transformers.CONFIG_MAPPING
    return {kind: n if isinstance(n, str) else n[0] for kind, n in sorted(names.items()) if kind in known}


def prompts(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Two prompts of :data:`PROMPT` random ids (3 up to the vocabulary, at most 1000), the second left-padded by
    :data:`PAD` with the model's pad id (0 when it names none)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocabulary = int(getattr(config, "vocab_size", 0) or 0)
    if vocabulary < 8:
        raise CannotRunEagerly(f"{type(model).__name__}: its config names no vocabulary of token ids")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, min(vocabulary, 1000), (BATCH, PROMPT), generator=generator)
    mask = torch.ones_like(ids)
    pad = getattr(config, "pad_token_id", None)
    ids[1, :PAD], mask[1, :PAD] = pad if isinstance(pad, int) and 0 <= pad < vocabulary else 0, 0
    return {"input_ids": ids, "attention_mask": mask}


def run_family(kind: str, class_name: str, precision: str, row: dict[str, Any]) -> dict[str, Any]:
    """One family's row, filled in ``row`` as it goes."""
    model_class = getattr(transformers, class_name, None)
    if isinstance(model_class, type) and not issubclass(model_class, GenerationMixin):
        row["converts"] = "not autoregressive"
        row["error"] = f"{class_name} does not generate with transformers' GenerationMixin"
        return row
    try:
        model, _sample = every.build(kind, class_name)
        model = quiet(as_decoder(model))
        inputs = prompts(model)
        expected_greedy, expected_beam = eager_tokens(model, inputs, row, GREEDY, BEAMS, PROMPT)
    except CannotRunEagerly:
        raise
    except Exception as error:  # noqa: BLE001 - transformers' own failure on the small config: the row says why
        raise CannotRunEagerly(f"{type(error).__name__}: {first_line(error)}") from error
    start = time.perf_counter()
    module = pipeline.convert(model, inputs, generation=GENERATION, precision=precision, validate=True)
    row["convert_s"] = round(time.perf_counter() - start, 1)
    row["converts"] = "yes"
    row["prompt_graph"] = getattr(module, "run_tokens", 0) or None
    ours = module.generate(**inputs, **GREEDY)
    row["greedy"] = torch.equal(ours, expected_greedy)
    if expected_beam is not None:
        row["beam"] = torch.equal(module.generate(**inputs, **GREEDY, num_beams=BEAMS), expected_beam)
    scored = {**GREEDY, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        expected_scores = model.generate(**inputs, **scored)
    row["scores"] = score_cell(scores_gap(expected_scores, module.generate(**inputs, **scored)), precision)
    with tempfile.TemporaryDirectory() as directory:
        module.save(Path(directory) / kind)
        loaded = pipeline.load(Path(directory) / kind)
        row["reloaded"] = torch.equal(loaded.generate(**inputs, **GREEDY), ours)
    if RTX:
        row["rtx"] = rtx_builds(model, inputs, GENERATION, precision)
    return row


def as_decoder(model: torch.nn.Module) -> torch.nn.Module:
    """A causal-LM head over an encoder's config (BERT's, RoBERTa's: ``is_decoder=False``, no cache) made again with
    ``is_decoder=True``, its weights kept, as a user loads one for generation (transformers asks for it)."""
    config = getattr(model, "config", None)
    if getattr(config, "is_decoder", None) is not False:
        return model
    config.is_decoder = True
    decoder = type(model)(config).eval()
    decoder.load_state_dict(model.state_dict())
    return decoder


def markdown(rows: list[dict[str, Any]], precision: str) -> str:
    """The results table and its summary line."""
    head = "| family | converts | greedy equal | greedy scores, max difference | beam (4) equal |"
    head += " saved + loaded equal | TensorRT-RTX builds | prompt graph | convert s | greedy tokens |"
    lines = [head + " error (or note) |", "|---" * head.count("|") + "|"]
    yes = {True: "yes", False: "**no**", None: ""}
    for r in rows:
        beam = r.get("beam")
        cells = [r["family"], r.get("converts", ""), yes[r.get("greedy")], r.get("scores", "")]
        cells += [beam if isinstance(beam, str) else yes[beam], yes[r.get("reloaded")], r.get("rtx", "")]
        cells += [r.get("prompt_graph") or "", r.get("convert_s", ""), r.get("tokens", ""), r.get("error", "")]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    eager = [r for r in rows if r.get("converts") not in ("cannot run eagerly", "not autoregressive")]
    converted = [r for r in eager if r.get("converts") == "yes"]
    equal = [r for r in converted if r.get("greedy") and r.get("beam") is not False and r.get("reloaded")]
    built = [r for r in converted if str(r.get("rtx", "")).startswith("yes")]
    lines += [
        "",
        f"{len(rows)} causal-LM model types, {precision}: {len(eager)} run eagerly from the small config, "
        f"{len(converted)} convert (validated), {len(equal)} decode as transformers does (greedy, beam search, saved "
        f"+ loaded){scores_clause(converted, precision)}, TensorRT-RTX builds every graph of {len(built)}",
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the families (resuming from ``--jsonl``) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model types (as transformers names them: llama, mamba)")
    parser.add_argument("--jsonl", type=Path, default=Path("causal_lm_families.jsonl"), help="rows, resumable")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one family may take")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="the conversions' precision")
    parser.add_argument("--no-rtx", action="store_true", help="no TensorRT-RTX build (faster)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one family, its row printed as JSON
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.simplefilter("ignore")
    global RTX
    RTX = not args.no_rtx
    known = families()
    if args.child:
        print(json.dumps(row_of(run_family, args.child, known[args.child], args.precision)), flush=True)
        return
    chosen = [kind for kind in known if not args.only or kind in args.only]
    print(f"{len(known)} causal-LM model types in transformers; {len(chosen)} chosen", flush=True)
    flags = ["--precision", args.precision, *(["--no-rtx"] if args.no_rtx else [])]
    done = resumed_rows(__file__, chosen, args.jsonl, args.timeout, flags)
    print(markdown([done[kind] for kind in chosen if kind in done], args.precision))


if __name__ == "__main__":
    main()
