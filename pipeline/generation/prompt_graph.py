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
