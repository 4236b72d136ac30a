"""Before a decoder-only step is exported: the step in PyTorch over its static cache, fed its own greedy tokens,
against the model's own logits for the same tokens (:func:`checked_step`).

The step hands the model keys and values over the cache's whole capacity, the positions not yet written masked. A
model whose own attention code reads the keys' length (GPT-Neo's cuts its local window from a causal buffer by it:
``bias[:, :, key_length - query_length : key_length, :key_length]``) then places its window at the end of the
capacity, and its logits are not its own. Such a model gets the step that hands it the written positions only
(:attr:`~pipeline.generation.step.CachedStep.written_only`: keys, values and the 2-D mask cut to ``past_length`` plus
the step's tokens, as transformers' growing cache holds them; the cache is still written in place and returned whole,
so the graph's inputs and outputs and the runtime are the same). One that decodes over neither form is refused with the
reason, before the long way to an accuracy error. The encoder-decoders' check is
:mod:`pipeline.generation.static_cache_check`.

Its cost is one prefill and three decode steps of the step in PyTorch over the sample's first prompt and that prompt
left-padded (when ``max_batch`` >= 2), and one forward of the model over the same tokens (a 2-layer Llama of width
64: 0.2-0.3 s of one core; GPT-Neo's, which also tries the written-only step, 0.4-0.6 s). A model in training mode is
not checked (dropout), nor one the check cannot run (the step or the model failing in PyTorch here: said in the log;
the export goes on as before). It runs where the model's parameters are (a model on a GPU is checked there).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from converters.errors import InputError
from converters.generation_settings import GenerationSettings
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.model_cache import cache_argument
from pipeline.generation.seq2seq import cache_of
from pipeline.generation.static_cache_check import CHECKED_STEPS, STEP_TOLERANCE
from pipeline.generation.step import CachedStep, indexed_layers
from pipeline.runtime.generation.feed import StepFeed

logger = logging.getLogger(__name__)

#: The masked columns before the checked prompt's second row (a left-padded one).
PADDING = 2


@dataclass(frozen=True)
class Difference:
    """Where the step's logits first leave the model's: the ``step`` (0: the prompt's last token) and the ``row``, the
    largest difference and the largest logit (the tolerance is relative to it)."""

    step: int
    row: int
    worst: float
    scale: float


def checked_step(
    model: torch.nn.Module,
    layout: Sequence[Any],
    use_interface: bool,
    input_ids: torch.Tensor,
    generation: GenerationSettings,
) -> CachedStep:
    """The :class:`~pipeline.generation.step.CachedStep` of ``model`` (one per cached layer of ``layout``) to export:
    over the whole static cache when it gives the model's own logits; else, for a model whose attention is its own
    code (not transformers' ``AttentionInterface``), over the written positions only when that one gives them; else an
    InputError naming the first step that differs."""
    step = CachedStep(model, len(layout), use_interface, indexed_layers(layout))
    if model.training:  # dropout: two runs of the model differ anyway
        return step
    prompt = checked_prompt(input_ids, generation)
    try:
        found = difference(model, step, layout, *prompt, generation)
    except _CannotCheck as reason:
        logger.info("%s: its step was not checked before export: %s", type(model).__name__, reason)
        return step
    if found is None:
        return step
    if use_interface or step.indexed:  # the step's own attention over the cache (or its indexer's): no other form
        raise _refusal(model, found, prompt[0].shape[1], "", indexed=not use_interface)
    step.written_only = True
    try:
        second = difference(model, step, layout, *prompt, generation)
    except _CannotCheck as reason:
        failed = f"over the written cache positions only it fails ({reason})"
        raise _refusal(model, found, prompt[0].shape[1], failed) from reason
    if second is not None:
        where = f"step {second.step}, max difference {second.worst:.3g}"
        raise _refusal(
            model, found, prompt[0].shape[1], f"over the written cache positions only it differs too ({where})"
        )
    logger.info(
        "%s's own attention code decodes over the written cache positions only, not the whole static cache (step %d "
        "differed by %.3g): its step is handed those",
        type(model).__name__,
        found.step,
        found.worst,
    )
    return step


def checked_prompt(input_ids: torch.Tensor, generation: GenerationSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt rows the check decodes and their mask: the sample's first, and when the step takes a batch and the
    prompt is longer than :data:`PADDING`, its last tokens left-padded by :data:`PADDING` (the pad id, masked)."""
    first = input_ids[:1].cpu()  # the feed's device; the runner moves what it hands the step
    mask = torch.ones_like(first)
    if generation.max_batch < 2 or first.shape[1] <= PADDING:
        return first, mask
    pad = generation.pad_token_id if generation.pad_token_id is not None else 0
    padded = torch.cat([torch.full((1, PADDING), pad, dtype=first.dtype), first[:, PADDING:]], dim=1)
    masked = torch.cat([torch.zeros(1, PADDING, dtype=mask.dtype), mask[:, PADDING:]], dim=1)
    return torch.cat([first, padded]), torch.cat([mask, masked])


class _CannotCheck(Exception):
    """The check cannot run on this model (its step or forward fails in PyTorch here, or its logits are not finite):
    the step is exported unchecked, as before the check existed."""


class _TorchRunner:
    """The step in PyTorch as a :class:`~pipeline.runtime.generation.runners.StepRunner` (the runtime's feed drives
    it: the same mask, positions and cache writes as the converted module's)."""

    def __init__(self, step: CachedStep, layout: Sequence[Any], capacity: int, device: torch.device) -> None:
        self.step, self.layout, self.capacity, self.device = step, layout, capacity, device
        self.cache: list[torch.Tensor] = []

    def start(self, batch: int) -> None:
        storage = (tensor for layer in self.layout for tensor in layer.storage(batch, self.capacity))
        self.cache = [tensor.to(self.device) for tensor in storage]

    def run(self, input_ids: Any, attention_mask: Any, position_ids: Any, past_length: int) -> torch.Tensor:
        fed = (tensor.to(self.device) for tensor in (input_ids, attention_mask, position_ids))
        out = self.step(*fed, torch.tensor(past_length, device=self.device), *self.cache)
        self.cache = [value for name, value in out.items() if name != "logits"]
        return out["logits"].cpu()  # the feed's tensors are the CPU's

    def reorder(self, rows: torch.Tensor) -> None:
        self.cache = [tensor.index_select(0, rows.to(self.device)) for tensor in self.cache]


def difference(
    model: torch.nn.Module,
    step: CachedStep,
    layout: Sequence[Any],
    ids: torch.Tensor,
    mask: torch.Tensor,
    generation: GenerationSettings,
) -> Difference | None:
    """The step's logits over its own greedy tokens (the prompt's last and :data:`CHECKED_STEPS` - 1 decode steps)
    against the model's forward over the same tokens without a cache, or where that differs, its decoding of them over
    its own cache (what ``generate`` computes): None when either agrees (:data:`STEP_TOLERANCE`, relative to the
    largest logit), else the first difference. :class:`_CannotCheck` when the step or the model fails here."""
    count = min(CHECKED_STEPS, generation.max_length - ids.shape[1] + 1)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        with torch.no_grad():
            runner = _TorchRunner(step, layout, generation.max_length, device)
            feed = StepFeed.of(runner, ids, mask, generation, 0, room=count - 1)
            logits, tokens = [feed.prefill()], []
            for _ in range(count - 1):
                tokens.append(logits[-1].argmax(-1))
                logits.append(feed.step(tokens[-1]))
            actual = torch.stack(logits, dim=1).float()
            fed = torch.stack(tokens, dim=1) if tokens else ids[:, :0]
            expected = _forward_logits(model, ids.to(device), mask.to(device), fed.to(device)).cpu()
    except Exception as error:  # noqa: BLE001 - the check does not apply; the export says what fails, if anything does
        raise _CannotCheck(f"{type(error).__name__}: {' '.join(str(error).split())[:200]}") from error
    bound = STEP_TOLERANCE.get(expected.dtype, STEP_TOLERANCE[torch.float32])  # the model's type, not the check's
    found = _compared(actual, expected.float(), bound)
    if found is None:
        return None
    try:
        with torch.no_grad():
            decoded = _decoded_logits(model, ids.to(device), mask.to(device), fed.to(device)).cpu().float()
    except Exception:  # noqa: BLE001 - a model that cannot decode over its own cache here: the forward's verdict holds
        return found
    try:
        second = _compared(actual, decoded, bound)
    except _CannotCheck:  # its own cached decoding not finite: the forward's verdict holds
        return found
    return None if second is None else min(found, second, key=lambda d: d.worst)


def _compared(actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> Difference | None:
    """None when ``actual`` [rows, steps, vocabulary] is ``expected`` within ``tolerance`` times its largest logit
    (or 1)."""
    if not bool(expected.isfinite().all()):
        raise _CannotCheck("the model's own logits are not finite")
    gap = (actual - expected).abs().nan_to_num(float("inf"))
    scale = max(1.0, float(expected.abs().amax()))
    outside = (gap > tolerance * scale).any(-1)  # [rows, steps]
    if not bool(outside.any()):
        return None
    step = int(outside.any(0).nonzero()[0])
    return Difference(step, int(outside[:, step].nonzero()[0]), float(gap[:, step].amax()), scale)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """The positions transformers' ``generate`` gives a (left-padded) row: ``cumsum(mask) - 1``, 1 where masked."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


def _forward_logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, fed: torch.Tensor) -> torch.Tensor:
    """The model's logits [rows, fed + 1, vocabulary] at the prompt's last token and at each token ``fed``, from one
    forward over the prompt and the tokens, without a cache."""
    full = torch.cat([mask, torch.ones_like(fed)], dim=1)
    call: dict[str, Any] = {"input_ids": torch.cat([ids, fed], dim=1), "attention_mask": full, "use_cache": False}
    if "position_ids" in inspect.signature(model.forward).parameters:
        call["position_ids"] = _positions(full)
    return model(**call).logits[:, ids.shape[1] - 1 :]


def _decoded_logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, fed: torch.Tensor) -> torch.Tensor:
    """The logits of :func:`_forward_logits`, the prompt and then each token ``fed`` over the model's own cache."""
    takes = inspect.signature(model.forward).parameters
    positions = "position_ids" in takes
    name = cache_argument(model)
    full = torch.cat([mask, torch.ones_like(fed)], dim=1)
    cache, logits = None, []
    for start, end in [(0, ids.shape[1])] + [(ids.shape[1] + k, ids.shape[1] + k + 1) for k in range(fed.shape[1])]:
        tokens = ids if start == 0 else fed[:, start - ids.shape[1] : end - ids.shape[1]]
        call: dict[str, Any] = {"input_ids": tokens, "attention_mask": full[:, :end], "use_cache": True}
        if positions:
            call["position_ids"] = _positions(full[:, :end])[:, start:end]
        if cache is not None:
            call[name] = cache
        out = model(**call)
        cache = cache_of(out)
        logits.append(out.logits[:, -1])
    return torch.stack(logits, dim=1)


def _refusal(model: torch.nn.Module, found: Difference, prompt: int, written: str, indexed: bool = False) -> InputError:
    """The InputError of a step that does not give the model's own logits (``written``: how the step over the written
    cache positions only did, for a model whose attention is its own code; ``indexed``: a step with indexer caches
    whose attention is the model's own code, which has no such form)."""
    where = "at the prompt's last token" if found.step == 0 else f"at decode step {found.step}"
    row = "the sample's first prompt" if found.row == 0 else f"that prompt left-padded by {PADDING}"
    message = (
        f"{type(model).__name__}'s decoder step over a static cache gives other logits than its own forward over the "
        f"same tokens {where} (cache position {prompt - 1 + found.step} of {row}: max difference "
        f"{found.worst:.3g}, logits up to {found.scale:.3g})"
    )
    if written:
        return InputError(
            f"{message}; {written}: its own attention code (not through transformers' AttentionInterface) reads what "
            "the static cache holds otherwise than transformers' growing cache",
            fix=f"{PLAIN_FORWARD}, or use a model whose attention transformers dispatches through AttentionInterface",
        )
    if indexed:
        return InputError(
            f"{message}; its layers also cache an indexer's keys, for which the step has no form over the written "
            "positions only, and its attention is its own code (not through transformers' AttentionInterface)",
            fix=f"{PLAIN_FORWARD}, and report the model",
        )
    return InputError(
        f"{message}; its attention runs as the step's own (transformers' AttentionInterface), so the difference is "
        "in the model's other code over the cache",
        fix=f"{PLAIN_FORWARD}, and report the model",
    )
