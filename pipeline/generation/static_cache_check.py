"""Before an encoder-decoder's step is exported: the step in PyTorch over its static cache, fed its own greedy tokens,
against the model's own logits for the same tokens (:func:`step_over_static_cache`). A model whose own attention code
masks no cache position (FSMT's, LED's over one decoder token) gets the step that hands it the written positions only;
one that decodes over neither form of the step is refused with the reason, before the long way to an accuracy error."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from converters.errors import AccuracyError, InputError
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.seq2seq import Seq2SeqStep, decode_over_own_cache, encode_and_decode
from pipeline.runtime.generation.layout import present_name

logger = logging.getLogger(__name__)

#: Decoder steps of the PyTorch step compared with the model's own forward before the step is exported.
CHECKED_STEPS = 4
#: Their largest logit difference, relative to the largest logit (or 1), that counts as the same (rounding), for a
#: model in float32 and in a 16-bit type.
STEP_TOLERANCE = {torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 5e-2}


def step_over_static_cache(
    model: torch.nn.Module,
    make_step: Callable[[bool], Seq2SeqStep],
    inputs: dict[str, torch.Tensor],
    sample: tuple[Any, ...],
    layers: int,
) -> Seq2SeqStep:
    """The step to export (``make_step(written_only)``): the one over the whole static cache when it gives the
    model's own logits (:func:`_static_cache_failure`); else, for a model with attention code of its own that masks
    no cache position (FSMT's and LED's attend to every key over one decoder token: transformers' growing cache holds
    only written ones), the step that hands the model the written positions only, when that one gives them. Else the
    first failure, raised."""
    step = make_step(False)
    failure = _static_cache_failure(model, step, inputs, sample, layers)
    if failure is None:
        return step
    if step.use_interface:
        raise failure
    written = make_step(True)
    second = _static_cache_failure(model, written, inputs, sample, layers)
    if second is not None:
        logger.info("encoder-decoder: over the written cache positions only, too: %s", second)
        raise failure
    logger.info(
        "encoder-decoder: %s's own attention masks no cache position; its step attends to the written ones only",
        type(model).__name__,
    )
    return written


def _static_cache_failure(
    model: torch.nn.Module, step: Seq2SeqStep, inputs: dict[str, torch.Tensor], sample: tuple[Any, ...], layers: int
) -> InputError | AccuracyError | None:
    """The step in PyTorch over its static cache, fed its own greedy tokens, against the model's forward over the same
    tokens without a cache, or where that differs, its decoding of them over its own cache (what ``generate`` does):
    None when they agree, else the error saying why not. A model whose own attention code
    does not mask the static cache's unwritten positions (FSMT's builds its causal mask for the tokens it is given)
    reads zeros there: no graph of that step could decode, and the export would only be the long way to an accuracy
    error."""
    if model.training:  # dropout: two runs of the model differ anyway
        return None
    ids, encoder_mask, _, *states = sample
    past, cross = list(states[: 2 * layers]), states[2 * layers :]
    tokens, logits = [ids], []
    own = "" if step.use_interface else " (its own attention code: it does not dispatch through AttentionInterface)"
    with torch.no_grad():
        try:
            for position in range(min(CHECKED_STEPS, past[0].shape[-2])):
                out = step(tokens[-1], encoder_mask, torch.tensor(position, dtype=torch.int64), *past, *cross)
                past = [out[present_name(i, kind)] for i in range(layers) for kind in ("key", "value")]
                logits.append(out["logits"].float())
                tokens.append(out["logits"].argmax(-1, keepdim=True))
        except Exception as error:  # noqa: BLE001 - the model's code refusing a static cache: said with its cause
            failure = InputError(
                f"{type(model).__name__}'s decoder fails over a static cache{own}: {type(error).__name__}: "
                f"{' '.join(str(error).split())[:300]}",
                fix=f"{PLAIN_FORWARD}; generation= needs a decoder that runs over a "
                "static cache (transformers' Cache API, attention through AttentionInterface)",
            )
            failure.__cause__ = error
            return failure
        given = torch.cat(tokens[:-1], dim=1)
        reference, _ = encode_and_decode(model, inputs, given, use_cache=False)
    expected, actual = reference.logits.float(), torch.stack(logits, dim=1)
    worst = float((expected - actual).abs().amax())
    scale = max(1.0, float(expected.abs().amax()))
    bound = STEP_TOLERANCE.get(reference.logits.dtype, STEP_TOLERANCE[torch.float32]) * scale
    if worst <= bound:
        return None
    decoded: torch.Tensor | None = None
    try:  # the forward over every token at once is not always what generate computes: its decoding over its cache is
        with torch.no_grad():
            decoded = decode_over_own_cache(model, inputs, given).float()
    except Exception:  # noqa: BLE001 - a model that cannot decode over its own cache here: the forward's verdict holds
        decoded = None
    if decoded is not None and decoded.shape == actual.shape:
        closer = float((decoded - actual).abs().amax())
        if closer <= bound:
            return None
        if closer < worst:
            expected, worst = decoded, closer
    first = int(((expected - actual).abs().amax(dim=(0, 2)) > bound).nonzero()[0])
    message = (
        f"{type(model).__name__}'s decoder step over a static cache gives other logits than its forward over the "
        f"same tokens from decoder position {first} (max difference {worst:.3g}, logits up to {scale:.3g})"
    )
    if not step.use_interface:
        return InputError(
            f"{message}{own}: it does not mask the positions of a static cache it has not written, and over the "
            "written positions only it does not decode either",
            fix=f"{PLAIN_FORWARD}, or use a model whose attention transformers dispatches through AttentionInterface",
        )
    return AccuracyError(message, fix="report the model: its attention runs as the step's own")
