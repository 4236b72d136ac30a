"""A recurrent model's prompt graph: its cached step exported a second time, taking ``prompt_tokens`` tokens per run.

The step of a model whose cache keeps recurrent states (:mod:`pipeline.generation.recurrent_state`) takes one token:
a model's multi-token path loops over its chunks in Python, a count torch.export cannot keep symbolic. Fed token by
token, a prompt of n tokens is n runs, and it goes through the model's one-token path, where transformers' prompt goes
through its chunked scan. The two are not always the same function: Nemotron-H's chunked scan clamps its time step
``dt`` from below, its one-token update does not, so a prompt fed token by token decodes otherwise than
``model.generate`` wherever the clamp bites.

The prompt graph is the same :class:`~pipeline.generation.recurrent_state.RecurrentStep` exported with a static
sequence of ``prompt_tokens`` tokens (the batch dynamic as the step's): the same inputs and outputs, the cache and
states read and written as the step does, each run continuing from the states the last one left (transformers' own
chunked prefill: the convolution over the states' last inputs, the scan from the recurrent state). The runners run
runs of several tokens on it and the decode steps on the step, over one cache
(:func:`~pipeline.runtime.generation.runners.step_runner`). A prompt is left-padded to whole runs
(:func:`~pipeline.runtime.generation.feed.prompt_padding`): the padding is masked as a padded batch's is (the
states stay zero through it), so the prompt's tokens go through the chunked scan as in ``model.generate``. When the
padding would leave no room for the new tokens asked for, the leading tokens that fill no whole run go one at a time
through the step instead.

No architecture's code is read: the model's own multi-token path, called on the Cache API, is what is exported.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import torch

from pipeline.settings import Settings

logger = logging.getLogger(__name__)


def prompt_sample(step_sample: Any, settings: Settings) -> tuple[Any, Settings]:
    """The prompt graph's sample and settings from the one-token step's: ``prompt_tokens`` tokens from an empty cache
    (the step's first token repeated), the step's dynamic batch, no sequence axis (the count is static)."""
    generation = settings.generation
    assert generation is not None and generation.prompt_tokens >= 2
    tokens = generation.prompt_tokens
    (ids, mask, positions, past_length, *past), kwargs = step_sample
    batch = ids.shape[0]
    ids = ids[:, :1].expand(batch, tokens).clone()
    mask = torch.zeros_like(mask)
    mask[:, :tokens] = 1
    positions = torch.arange(tokens).unsqueeze(0).expand(batch, -1).clone()
    dims = tuple(d for d in settings.dynamic if d.name != "sequence")
    config = dataclasses.replace(settings, dynamic=dims, profiles=())
    logger.info("generation: converting the prompt graph (%d tokens per run)", tokens)
    return ((ids, mask, positions, past_length, *past), kwargs), config


@dataclasses.dataclass(frozen=True)
class RunsProbe:
    """What :func:`probe_runs` found: ``broken``, why a run after the first does not continue from the states the
    last left (None: runs continue); ``first``, why the first run (from zero states) is not the model's own prefill
    (None: it is)."""

    broken: str | None
    first: str | None


def probe_runs(model: torch.nn.Module, step: Any, layout: Any, ids: torch.Tensor, tokens: int) -> RunsProbe:
    """Whether the model's multi-token path continues from the states a run leaves, found by running it: two runs of
    ``tokens`` tokens through the step (eagerly, from zero states) against the model's own forward over the first
    ``tokens`` tokens and over all ``2 * tokens`` from nothing (its prefill). Mamba's selective scan starts from zero
    whatever the cache holds: its first run is its prefill, its second differs. ``step``: the step module over
    ``model``; ``layout``: its cache layout; ``ids``: the sample's token ids (repeated to fill)."""
    from pipeline.generation.recurrent_state import cache_names
    from pipeline.runtime.generation.layout import present_name

    row = ids[:1].reshape(-1)
    prompt = row.repeat(-(-2 * tokens // row.numel()))[: 2 * tokens].unsqueeze(0)
    capacity = 2 * tokens + 1
    mask = torch.zeros(1, capacity, dtype=torch.int64)
    mask[:, : 2 * tokens] = 1
    past = [tensor for layer in layout for tensor in layer.storage(1, capacity)]
    names = cache_names(layout, present_name)
    runs: list[torch.Tensor] = []
    try:
        with torch.no_grad():
            prefills = [model(input_ids=prompt[:, :end], use_cache=False).logits[:, -1] for end in (tokens, 2 * tokens)]
            for start in (0, tokens):
                positions = torch.arange(start, start + tokens).unsqueeze(0)
                out = step(prompt[:, start : start + tokens], mask, positions, torch.tensor(start), *past)
                past = [out[name] for name in names]
                runs.append(out["logits"])
    except Exception as error:  # noqa: BLE001 - a model that cannot be probed so: its prompts go token by token
        cause = " ".join(str(error).split())[:120]
        reason = f"its multi-token path could not be probed ({type(error).__name__}: {cause})"
        return RunsProbe(reason, reason)
    verdicts = [_apart(run, prefill, ends) for run, prefill, ends in zip(runs, prefills, (1, 2), strict=True)]
    first = f"its first run of {tokens} tokens ends {verdicts[0]}" if verdicts[0] else None
    broken = (
        f"its multi-token path does not continue from the states a run leaves (two runs of {tokens} tokens end "
        f"{verdicts[1]})"
        if verdicts[1]
        else None
    )
    return RunsProbe(broken, first)


def _apart(run: torch.Tensor, prefill: torch.Tensor, ends: int) -> str | None:
    """How the last logits of ``ends`` runs part from the model's own prefill of their tokens; None within the bound:
    in float32, 3e-5 of the largest logit (the models that continue end within 1e-6 of it; Mamba's scan 6e-4 off)."""
    reference = prefill.float()
    difference = float((run.reshape(reference.shape).float() - reference).abs().max())
    bound = 1e-6 + 250 * torch.finfo(run.dtype).eps * float(reference.abs().max())
    logger.debug("prompt graph: %d run(s) end %.3g off the prefill (bound %.3g)", ends, difference, bound)
    if difference <= bound:
        return None
    return f"{difference:.2g} from its own prefill, more than {bound:.2g}"


def probed_generation(
    model: torch.nn.Module,
    step: Any,
    layout: Any,
    ids: torch.Tensor,
    generation: Any,
    given: Any,
) -> Any:
    """``generation`` (:class:`GenerationSettings`) as :func:`probe_runs` leaves it: unchanged when runs continue;
    when only the first run is the model's prefill, ``prompt_continues=False`` (a prompt's first run on the prompt
    graph, its other tokens one at a time); else no prompt graph. Said loudly when ``given`` (the settings asked for)
    named the prompt graph's length (``max_prompt``), else logged."""
    tokens = generation.prompt_tokens
    if not tokens:
        return generation
    probe = probe_runs(model, step, layout, ids, tokens)
    if probe.broken is None:
        return generation
    asked = given is not None and given.names_prompt_length
    name = type(model).__name__
    if probe.first is None:
        _say(
            f"{name}: {probe.broken}; a prompt's first {tokens} tokens run on the prompt graph (the model's own "
            "prefill), the tokens after them one at a time through the step",
            asked,
        )
        return dataclasses.replace(generation, prompt_continues=False)
    _say(f"{name}: no prompt graph: {probe.first}; its prompts go token by token through the step", asked)
    return dataclasses.replace(generation, prompt_tokens=0)


def _say(message: str, loudly: bool) -> None:
    if loudly:
        warnings.warn(message, stacklevel=4)
    else:
        logger.info(message)
