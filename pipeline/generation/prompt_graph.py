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


def runs_continue(model: torch.nn.Module, step: Any, layout: Any, ids: torch.Tensor, tokens: int) -> str | None:
    """Why the model's multi-token path does not continue from the states a run leaves (None: it does), found by
    running it: two runs of ``tokens`` tokens through the step (eagerly, from zero states) against the model's own
    forward over the same ``2 * tokens`` tokens from nothing (its prefill). Mamba's selective scan starts from zero
    whatever the cache holds: its second run differs, and its prompts then go token by token. ``step``: the step
    module over ``model``; ``layout``: its cache layout; ``ids``: the sample's token ids (repeated to fill)."""
    from pipeline.generation.recurrent_state import cache_names
    from pipeline.runtime.generation.layout import present_name

    row = ids[:1].reshape(-1)
    prompt = row.repeat(-(-2 * tokens // row.numel()))[: 2 * tokens].unsqueeze(0)
    capacity = 2 * tokens + 1
    mask = torch.zeros(1, capacity, dtype=torch.int64)
    mask[:, : 2 * tokens] = 1
    past = [tensor for layer in layout for tensor in layer.storage(1, capacity)]
    names = cache_names(layout, present_name)
    try:
        with torch.no_grad():
            whole = model(input_ids=prompt, use_cache=False).logits[:, -1].float()
            out: dict[str, torch.Tensor] = {}
            for start in (0, tokens):
                positions = torch.arange(start, start + tokens).unsqueeze(0)
                out = step(prompt[:, start : start + tokens], mask, positions, torch.tensor(start), *past)
                past = [out[name] for name in names]
    except Exception as error:  # noqa: BLE001 - a model that cannot be probed so: its prompts go token by token
        cause = " ".join(str(error).split())[:120]
        return f"its multi-token path could not be probed ({type(error).__name__}: {cause})"
    runs = out["logits"].reshape(whole.shape).float()
    difference = float((runs - whole).abs().max())
    # float32: 3e-5 of the largest logit (the models that continue end within 1e-6 of it; Mamba's scan 6e-4 off)
    bound = 1e-6 + 250 * torch.finfo(out["logits"].dtype).eps * float(whole.abs().max())
    logger.debug("prompt graph: two runs of %d tokens end %.3g off the prefill (bound %.3g)", tokens, difference, bound)
    if difference > bound:
        return (
            f"its multi-token path does not continue from the states a run leaves (two runs of {tokens} tokens end "
            f"{difference:.2g} from its own prefill of {2 * tokens}, more than {bound:.2g})"
        )
    return None


def without_runs(model: torch.nn.Module, generation: Any, reason: str, asked: bool) -> Any:
    """``generation`` without a prompt graph, for ``reason`` (:func:`runs_continue`'s): said loudly when the prompt
    graph's length was ``asked`` for (``max_prompt``), else logged."""
    said = f"{type(model).__name__}: no prompt graph: {reason}; its prompts go token by token through the step"
    if asked:
        warnings.warn(said, stacklevel=3)
    else:
        logger.info(said)
    return dataclasses.replace(generation, prompt_tokens=0)
