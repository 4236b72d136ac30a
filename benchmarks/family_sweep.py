"""What the encoder-decoder and vision-language family sweeps share (``encoder_decoder_families.py``,
``vision_language_families.py``): one family per child process, the row of a family that fails, the models' livelier
weights, every step's scores against transformers', and TensorRT-RTX's real builder on every graph of the module.

Not a test: the sweeps import it from ``benchmarks/``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import pipeline

#: the precisions a sweep converts in (``--precision``); fp16 is judged by the conversion's own validation, which
#: holds the step's scores to the accuracy policy (tokens may then part from fp32 eager's where two scores are close)
PRECISIONS = ("fp32", "fp16")
#: the largest difference of any step's scores from transformers' that the fp32 goal allows
SCORE_TOLERANCE = 1e-3


class CannotRunEagerly(Exception):
    """transformers' own model or ``generate`` fails on the small config or the batch: not ours to judge."""


def first_line(error: BaseException) -> str:
    """The error's first line, at most 320 characters (a table cell)."""
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else "")[:320]


def lively(model: torch.nn.Module, seed: int = 0, gain: float = 1.5) -> Any:
    """``model`` with its matrices and kernels drawn wider (standard deviation ``gain / sqrt(fan-in)``; norms and
    biases keep theirs), so that greedy decoding does not repeat one token; eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2 and parameter.is_floating_point():
                fan_in = parameter[0].numel()
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * gain / fan_in**0.5)
    return model.eval()


def quiet(model: torch.nn.Module) -> Any:
    """``model`` with its matrices drawn wider (greedy tokens vary) and eos off (every row decodes every token)."""
    model = lively(model)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.eos_token_id = None
    return model


def resumed_rows(script: str, chosen: Sequence[str], jsonl: Path, timeout: float, flags: Sequence[str]) -> dict:
    """The rows of the ``chosen`` families by name: those ``jsonl`` holds already, the others run one at a time by
    :func:`run_isolated` (``script --child kind *flags``), each appended to ``jsonl`` and printed as it ends."""
    done: dict[str, dict[str, Any]] = {}
    if jsonl.exists():
        done = {row["family"]: row for row in map(json.loads, jsonl.read_text().splitlines()) if row}
    for kind in [kind for kind in chosen if kind not in done]:
        done[kind] = run_isolated(script, kind, timeout, flags)
        with jsonl.open("a") as out:
            out.write(json.dumps(done[kind]) + "\n")
        print(json.dumps(done[kind]), flush=True)
    return done


def row_of(run_family: Callable[..., dict[str, Any]], kind: str, *args: Any) -> dict[str, Any]:
    """The family's row from ``run_family(kind, *args, row)``, every failure in it (with what was measured before)."""
    row: dict[str, Any] = {"family": kind}
    try:
        return run_family(kind, *args, row)
    except CannotRunEagerly as exc:
        return {**row, "converts": "cannot run eagerly", "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a family that fails is a row of the table, with its reason
        traceback.print_exc()
        return {**row, "converts": "**no**", "error": f"{type(exc).__name__}: {first_line(exc)}"}


def run_isolated(script: str, kind: str, timeout: float, options: Sequence[str] = ()) -> dict[str, Any]:
    """The family's row from ``script --child kind`` in a process of its own (a crash, an exhausted memory or a hang is
    that family's row); its traceback on stderr when the failure is ours."""
    command = [sys.executable, script, "--child", kind, *options]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"family": kind, "converts": "**no**", "error": f"timed out after {timeout:.0f} s"}
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    row = dict(json.loads(rows[-1])) if rows else {}
    if done.returncode or row.get("converts") == "**no**":
        sys.stderr.write(f"--- {kind}\n{done.stderr[-6000:]}")
    return row or {"family": kind, "converts": "**no**", "error": f"the child process exited with {done.returncode}"}


#: A score at or below this is a masked token's (float16's lowest value).
MASKED = -65504.0


def eager_tokens(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    row: dict[str, Any],
    options: dict[str, Any],
    beams: int,
    prompt: int = 0,
    failure: Callable[[BaseException], str] | None = None,
) -> tuple[Any, Any]:
    """transformers' greedy (``options``) and beam-search (``beams``) tokens on ``inputs``; beam None: its generate
    has none, the row says. The row's ``tokens`` counts the distinct tokens after the first ``prompt`` columns;
    ``failure``: the cause a greedy run's exception is told as (:class:`CannotRunEagerly`), else it propagates."""
    with torch.no_grad():
        try:
            greedy = model.generate(**inputs, **options)
        except Exception as error:  # noqa: BLE001 - said as the caller tells it
            if failure is None:
                raise
            raise CannotRunEagerly(failure(error)) from error
        if isinstance(greedy, torch.Tensor):  # else a model that generates audio: the row says so
            distinct = len(set(greedy[:, prompt:].flatten().tolist()))
            row["tokens"] = f"{tuple(greedy.shape)}, {distinct} distinct{' new' if prompt else ''}"
        try:
            return greedy, model.generate(**inputs, **options, num_beams=beams)
        except Exception as error:  # noqa: BLE001 - a model whose own generate has no beam search: the row says so
            row["beam"] = f"n/a: transformers' {type(error).__name__}: {first_line(error)[:120]}"
            return greedy, None


def scores_gap(expected: Any, actual: Any) -> float | str:
    """The largest difference between two ``generate(..., output_scores=True, return_dict_in_generate=True)`` results'
    scores over every step (elements both hold unmasked; a step whose masked tokens differ counts as infinite), or why
    there is none to compare. Masked: -inf, or at most float16's lowest value (a model masking with
    ``finfo(float32).min`` gives that in fp32, and float16's lowest in a half graph)."""
    theirs, ours = getattr(expected, "scores", None), getattr(actual, "scores", None)
    if not theirs:
        return "n/a: transformers' generate returns no scores"
    if ours is None or len(ours) != len(theirs):
        return f"**no**: {0 if ours is None else len(ours)} steps of scores against transformers' {len(theirs)}"
    gap = 0.0
    for step_theirs, step_ours in zip(theirs, ours, strict=True):
        a, b = step_theirs.float(), step_ours.float()
        if a.shape != b.shape:
            return f"**no**: scores of shape {tuple(b.shape)} against transformers' {tuple(a.shape)}"
        finite = torch.isfinite(a) & (a > MASKED)
        if not torch.equal(finite, torch.isfinite(b) & (b > MASKED)):
            return math.inf
        if finite.any():
            gap = max(gap, float((a[finite] - b[finite]).abs().max()))
    return gap


def score_cell(gap: float | str, precision: str) -> str:
    """The table's cell for :func:`scores_gap`: the difference, and whether the fp32 goal (:data:`SCORE_TOLERANCE`)
    holds (fp16 is held to the accuracy policy by the conversion's validation instead)."""
    if isinstance(gap, str):
        return gap
    if precision != "fp32":
        return f"{gap:.2g}"
    return f"{gap:.2g}" if gap <= SCORE_TOLERANCE else f"**{gap:.2g}**"


def scores_clause(converted: list[dict[str, Any]], precision: str) -> str:
    """The summary's words on the scores: how many converted rows meet the fp32 goal (a row with nothing to compare,
    transformers returning no scores, counts); none in a lower precision, where the validation judged the steps on
    PyTorch's tokens and the column compares each side's own path."""
    if precision != "fp32":
        return ""
    within = [r for r in converted if isinstance(r.get("scores"), str) and not r["scores"].startswith("**")]
    return f", {len(within)} with every greedy step's scores within {SCORE_TOLERANCE:g}"


def rtx_builds(model: torch.nn.Module, inputs: dict[str, Any], generation: dict[str, Any], precision: str) -> str:
    """Whether TensorRT-RTX's real builder builds every graph of the generation module (ahead of time: no GPU here),
    or why not."""
    try:
        import tensorrt_rtx  # noqa: F401
    except ImportError:
        return "n/a (tensorrt-rtx not installed)"
    try:
        module = pipeline.convert(
            model, inputs, generation=generation, backend="tensorrt-rtx", precision=precision, validate=False
        )
    except Exception as error:  # noqa: BLE001 - the builder's refusal is the cell
        return f"**no**: {type(error).__name__}: {first_line(error)[:200]}"
    parts = {name: part for name, part in module.named_children() if hasattr(part, "engine_bytes")} or {"": module}
    for name, part in list(parts.items()):  # a recurrent text model's prompt graph, beside its step
        prompt = getattr(part, "prompt_graph", None)
        if prompt is not None:
            parts[f"{name} prompt".strip()] = prompt
    unbuilt = [name for name, part in parts.items() if not part.engine_bytes]
    if not unbuilt:
        return f"yes ({len(parts)} graphs)"
    return f"**no**: no single engine for the {', '.join(unbuilt)} graph (nodes the parser refuses run segmented)"
