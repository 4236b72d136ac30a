"""Per-step logits of a two-graph generation module (a vision-language model, an encoder-decoder) against
transformers' own ``model.generate`` on the conversion's sample.

Each graph is validated against PyTorch on its own, and the sample's greedy tokens against ``model.generate``; the
tokens alone would pass a step whose logits drift but keep their argmax. Here both ``generate`` calls return their
raw logits (``output_logits``), the tokens must be the same (so every step was fed the same tokens: the logits are
comparable one for one), and each step's logits are judged by the accuracy policy
(:func:`pipeline.accuracy.stats.judgement`; where the fixed tolerance fails, within PyTorch's own error: its
``generate`` run again, fed the same tokens, with every float32 op in float64, or in the half type) into a
:class:`DecodingAccuracy`, the report's ``decoding``. A float32 conversion fails on a step more than :data:`GROSS`
times beyond its tolerance (a wrong cache write, mask or position); within that, the two graphs' rounding compounds
(the encoder's or the vision tower's error carried into the step: each graph alone passed its validation) and the
note says so. A half-precision conversion's figures are reported and only its tokens can fail it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from converters.errors import AccuracyError
from pipeline.accuracy.anchor import ANCHOR_DTYPES, PrecisionMode, anchored_tolerance
from pipeline.accuracy.stats import judgement, tolerance_ratio
from pipeline.precision.stage import validation_settings
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.reports.accuracy import DecodingAccuracy
from pipeline.settings import Settings
from pipeline.validation.decoding import StepJudge, raise_decoding_error

#: How far past its tolerance a float32 step's logits fail the conversion (a wrong cache write, mask or position is
#: off by orders of magnitude; two graphs' rounding compounded is within a few times the anchored tolerance).
GROSS = 10.0
UNANCHORED_NOTE = "half-precision logits of a two-graph model: reported, not failed; the greedy tokens are identical"


def greedy_options(tokens: int) -> dict[str, Any]:
    """The options of both ``generate`` calls: greedy, ``tokens`` new tokens, the raw logits of every step."""
    return {
        "max_new_tokens": tokens,
        "do_sample": False,
        "num_beams": 1,
        "return_dict_in_generate": True,
        "output_logits": True,
    }


def judged_logits(
    ours: Any,
    theirs: Any,
    io: IOSpec,
    settings: Settings,
    label: str,
    prompt_tokens: int,
    reference: Callable[[], Any] | None = None,
    model: torch.nn.Module | None = None,
) -> DecodingAccuracy | None:
    """The per-step figures of two ``generate`` outputs with the same ``sequences`` (``ours``: the module's, ``theirs``:
    the model's), the step graph's ``io`` naming the logits' type (None when either has no logits, or not as many
    steps); raises the decoding AccuracyError when a float32
    conversion's step is more than :data:`GROSS` times beyond the policy. ``reference()`` runs ``model``'s
    ``generate`` again (the same call): where the fixed tolerance fails, it runs once with the model's weights and ops
    in the anchor type (float64 for a float32 graph) and the step is judged within PyTorch's own error there, as every
    validation judges."""
    if getattr(ours, "logits", None) is None or getattr(theirs, "logits", None) is None:
        return None  # a generate that returns no logits (a model's own generate may drop output_logits)
    if len(ours.logits) != len(theirs.logits):
        return None  # a model's own generate that adds steps of its own: the tokens were compared
    logits_dtype = next(o.dtype for o in io.outputs if o.name == "logits")
    judged = judgement("logits", logits_dtype, validation_settings(settings))
    judge = StepJudge(judged.tolerance)
    notes: set[str] = set()
    anchor: Any = None
    ratios: dict[int, float] = {}  # each step's worst element against what it is allowed (1: at the limit)
    for step, (got, want) in enumerate(zip(ours.logits, theirs.logits, strict=True)):
        got_array, want_array = got.float().cpu().numpy(), want.float().cpu().numpy()
        tolerance = None
        if (
            judged.anchor
            and reference is not None
            and model is not None
            and tolerance_ratio(got_array, want_array, judged.tolerance) > 1
        ):
            if anchor is None:
                anchor = _anchor_run(reference, model, judged.anchor, notes, theirs.sequences) or ()
            if _fed_alike(anchor, theirs, step):
                own = anchor.logits[step].double().cpu().numpy()
                tolerance = anchored_tolerance(judged.tolerance, want_array, own, judged.anchor, got_array)[0]
        judge.add(step, got_array, want_array, tolerance)
        ratios[step] = tolerance_ratio(got_array, want_array, tolerance or judged.tolerance)
    rows, steps = int(ours.sequences.shape[0]), len(ours.logits)
    per_step = judge.results()
    half = judged.computed_in != "float32"
    beyond = [s for s in per_step if not s.passed]
    worst = max((ratios[s.step] for s in beyond), default=0.0)
    if half:
        notes.add(UNANCHORED_NOTE)
    elif beyond and worst <= GROSS:
        notes.add(
            f"{len(beyond)} step(s) beyond the policy by at most {worst:.1f}x the tolerance, with identical tokens: "
            f"the two graphs' float32 rounding compounds (the encoder's states through the cross-attention, the image "
            f"features through the text); reported, failed only beyond {GROSS:g}x"
        )
    report = DecodingAccuracy(
        prompts=(label,),
        steps=max(steps - 1, 0),
        computed_in=judged.computed_in,
        tolerance={k: float(v) for k, v in vars(judged.tolerance).items() if isinstance(v, float)},
        per_step=per_step,
        greedy=rows * steps,
        greedy_tokens=rows * steps,
        precision=settings.precision,
        note="; ".join(sorted(notes)),
        rows=rows,
        prompt_tokens=prompt_tokens,
        logits_judged=rows * steps,
        greedy_reused=True,
    )
    if beyond and not half and worst > GROSS:
        raise_decoding_error(report)
    return report


def _anchor_run(
    reference: Callable[[], Any],
    model: torch.nn.Module,
    computed_in: str,
    notes: set[str],
    sequences: torch.Tensor | None = None,
) -> Any:
    """The model's ``generate`` with its float32 weights and every float32 op in the anchor type of ``computed_in``
    (the weights put back after); None (with a note) when the model cannot run so.

    The run is fed ``sequences`` (the reference's tokens, :func:`follow_tokens`): PyTorch's own half precision parts
    from its float32 at a near tie too, and every step after it would lose its anchor (GLM-4.6V's 24-block tower in
    fp16: PyTorch float16 chose another token at step 5, and steps 6-7 fell back to the fixed tolerance). A generate
    that does not follow them (it takes no processor, or lays out its sequences otherwise) runs as it is."""
    dtype = ANCHOR_DTYPES[computed_in]
    mode = PrecisionMode(dtype)
    try:
        with torch.no_grad(), _weights_in(model, dtype), mode:
            out, unfollowed = _followed(_inputs_in(reference, dtype), sequences)
    except Exception as error:  # noqa: BLE001 - the fixed tolerance stands, and the report says why
        notes.add(
            f"PyTorch cannot generate in {ANCHOR_DTYPES[computed_in]} for the anchored rule: {type(error).__name__}"
        )
        return None
    if unfollowed:
        notes.add(
            f"PyTorch's own {str(dtype).removeprefix('torch.')} run for the anchored rule chose its own tokens "
            f"({unfollowed}): a step after it parts from the reference's tokens keeps the fixed tolerance"
        )
    return out


def _followed(reference: Callable[[], Any], sequences: torch.Tensor | None) -> tuple[Any, str]:
    """``reference()`` fed ``sequences``' tokens where its ``generate`` takes them and gives them back, else run as it
    is, with why (``""``: followed, or nothing to follow: no ``sequences``, a call that is not a
    ``functools.partial``)."""
    if sequences is None or not isinstance(reference, functools.partial):
        return reference(), ""
    if "logits_processor" in reference.keywords:
        return reference(), "the call already holds a logits processor"
    try:
        out = functools.partial(reference, logits_processor=follow_tokens(sequences))()
    except Exception as error:  # noqa: BLE001 - a generate that takes no processor: run it as it is, and say so
        return reference(), f"its generate refused the token-forcing logits processor: {type(error).__name__}"
    got = getattr(out, "sequences", None)
    if got is not None and torch.equal(got.cpu(), sequences.cpu()):
        return out, ""
    return reference(), "its generate did not keep the forced tokens"


def _inputs_in(reference: Callable[[], Any], dtype: torch.dtype) -> Callable[[], Any]:
    """``reference`` (a ``functools.partial`` of the model's ``generate``) with its float32 tensors in ``dtype``: the
    mode casts what reaches the dispatcher, but some ops check their types before it (``conv2d``'s input against its
    weight and bias: DeepSeek-VL-Hybrid's high-resolution tower refused float32 pixels beside float16 weights), as
    :class:`~pipeline.accuracy.anchor.AnchorRuns` casts its feeds."""
    if not isinstance(reference, functools.partial):
        return reference

    def cast(value: Any) -> Any:
        return value.to(dtype) if isinstance(value, torch.Tensor) and value.dtype == torch.float32 else value

    args, keywords = pytree.tree_map(cast, (reference.args, reference.keywords))
    return functools.partial(reference.func, *args, **keywords)


@contextlib.contextmanager
def _weights_in(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """``model``'s float32 parameters and buffers in ``dtype`` within the block, as they were after it."""
    kept = [(t, t.data) for t in (*model.parameters(), *model.buffers()) if t.dtype == torch.float32]
    try:
        for tensor, data in kept:
            tensor.data = data.to(dtype)
        yield
    finally:
        for tensor, data in kept:
            tensor.data = data


def _fed_alike(anchor: Any, theirs: Any, step: int) -> bool:
    """Whether the anchor run was fed the same tokens as the reference up to ``step`` (its logits there compare)."""
    if not anchor or len(anchor.logits) <= step:
        return False
    width = theirs.sequences.shape[1] - len(theirs.logits) + step  # the prompt, then the tokens chosen before
    return bool(torch.equal(anchor.sequences[:, :width], theirs.sequences[:, :width]))


def with_decoding(module: Any, decoding: DecodingAccuracy | None) -> None:
    """``module``'s report (a converted graph's) with ``decoding`` in its accuracy report (None: nothing to add)."""
    report = module.report
    if decoding is not None and report is not None and report.accuracy is not None:
        module.report = dataclasses.replace(report, accuracy=dataclasses.replace(report.accuracy, decoding=decoding))


def prompt_tokens(mask: torch.Tensor | None, ids: torch.Tensor) -> int:
    """The prompt's tokens, padding not counted."""
    return int(mask.sum()) if mask is not None else int(ids.numel())


def follow_tokens(sequences: torch.Tensor) -> Any:
    """A transformers logits processor that makes ``generate`` choose ``sequences``' next token at every step (the
    rest of the row's scores -inf): the converted model fed PyTorch's tokens, so that its raw logits (``output_logits``)
    are the teacher-forced ones where its own greedy choice departed (a half-precision near tie)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class Follow(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            chosen = sequences[:, input_ids.shape[1]].to(scores.device)
            forced = torch.full_like(scores, float("-inf"))
            return forced.scatter(1, chosen[:, None], 0.0)

    return LogitsProcessorList([Follow()])


def diverged(report: DecodingAccuracy | None, wanted: torch.Tensor, chosen: torch.Tensor, width: int) -> Any:
    """``report`` (judged on PyTorch's tokens) saying how many of the new tokens the converted model chose on its own
    equal ``model.generate``'s and where they first differ."""
    if report is None:
        return None
    new_wanted, new_chosen = wanted[:, width:], chosen[:, width : wanted.shape[1]]
    same = new_wanted == new_chosen
    columns = (~same).any(dim=0).nonzero()
    note = (
        f"{report.precision}: the greedy tokens depart from PyTorch float32's (a near tie in the low precision); every "
        f"step's logits judged on PyTorch's tokens (within {GROSS:g}x the policy)"
    )
    kept = [part for part in report.note.replace(UNANCHORED_NOTE, "").split("; ") if part]  # it holds a "; "
    return dataclasses.replace(
        report,
        greedy=int(same.sum()),
        greedy_tokens=int(same.numel()),
        first_divergence=int(columns[0, 0]) if len(columns) else -1,
        greedy_reused=False,
        note="; ".join([*kept, note]),
    )


def departed(model: torch.nn.Module, what: str, wanted: torch.Tensor, chosen: torch.Tensor, precision: str) -> bool:
    """Whether the module's greedy tokens ``chosen`` part from ``model.generate``'s ``wanted`` at a lower precision's
    near tie, to be judged on PyTorch's tokens (:func:`follow_tokens`, then :func:`judged_departure`); False where
    they are equal. Raises the AccuracyError where they may not part: a float32 conversion, or fewer tokens. ``what``
    names the module in the message ("the converted encoder-decoder")."""
    if torch.equal(wanted, chosen):
        return False
    if precision == "fp32" or wanted.shape[1] > chosen.shape[1]:
        raise AccuracyError(
            f"{what}'s greedy tokens differ from {type(model).__name__}.generate on the sample: expected "
            f"{wanted.tolist()}, got {chosen.tolist()}",
            fix="convert with precision='fp32' to confirm; report the model (each graph passed its validation)",
        )
    return True


def judged_departure(
    judged: DecodingAccuracy | None,
    model: torch.nn.Module,
    what: str,
    wanted: torch.Tensor,
    chosen: torch.Tensor,
    width: int,
    precision: str,
) -> DecodingAccuracy | None:
    """The decoding report of greedy tokens that :func:`departed`: ``judged`` (the module's logits fed PyTorch's
    tokens, :func:`judged_logits`) saying where the tokens part (:func:`diverged`; ``width``: the prompt's columns of
    the sequences). A near tie only when those logits are within :data:`GROSS` x the policy: else an AccuracyError
    (a wrong step that kept the argmax for a while)."""
    worst = None if judged is None else judged.worst_step
    if worst is None or worst.max_abs > GROSS * worst.atol_used:
        raise AccuracyError(
            f"{what}'s greedy tokens differ from {type(model).__name__}.generate on the sample ({precision}), and its "
            f"logits fed PyTorch's tokens are more than {GROSS:g}x beyond the accuracy policy"
            + ("" if worst is None else f" (step {worst.step}: {worst.max_abs:.3g})")
            + f": expected {wanted.tolist()}, got {chosen.tolist()}",
            fix="convert with precision='fp32' to confirm, or keep the offending layers in float32 (keep_fp32=[...])",
        )
    return diverged(judged, wanted, chosen, width)
