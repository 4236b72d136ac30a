"""One request's steps over a runner: the prompt prefilled, then one token per row per step.

The feed keeps what transformers keeps beside the cache: the attention mask (the prompt's, then a column of ones
per step) and the positions (``cumsum(attention_mask) - 1``, so a left-padded row counts from its first token). A
prompt longer than the context profile (``chunk``) is prefilled in chunks. Greedy, sampled and beam decoding all
feed the step through it.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from pipeline.runtime.generation.runners import StepRunner


def evict(mask: Any, prompt: int, column: int, window: int) -> None:
    """Mask out the generated token a model's cache no longer keeps once the token at ``column`` is fed: a cache that
    keeps the prompt's ``prompt`` tokens and the last ``window`` generated ones, the fed token's own among them,
    drops the generated token at ``column - window`` (:attr:`GenerationSettings.kept_window`; 0: none dropped).
    ``mask`` [rows, capacity], a tensor or its numpy view, written in place."""
    if window > 0 and column - window >= prompt:
        mask[:, column - window] = 0


class Feed(Protocol):
    """What the decoding loops drive: the prompt rows (``ids``), their prefill, one token per row per step, and the
    cache rows moved between steps (beam search). :class:`StepFeed` for a decoder-only step; an encoder-decoder has
    its own (:mod:`pipeline.runtime.generation.encoder_decoder`)."""

    ids: torch.Tensor

    def prefill(self) -> torch.Tensor:
        """The prompt through the step; the logits after its last token [rows, vocab]."""
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One new token per row [rows]; the logits [rows, vocab]."""
        ...

    def reorder(self, rows: torch.Tensor) -> None:
        """Row ``i`` of the cache becomes what row ``rows[i]`` was."""
        ...


def prompt_padding(length: int, capacity: int, prompt_tokens: int, room: int, continues: bool = True) -> int:
    """The padding put before a prompt of ``length`` tokens for a recurrent model's prompt graph, which takes
    ``prompt_tokens`` per run (:mod:`pipeline.generation.prompt_graph`): up to the next whole run, when the padded
    prompt leaves ``room`` positions of the ``capacity`` for the tokens to come; else 0 (the runs of the prompt graph
    are then preceded by the leading tokens one at a time: :func:`prompt_runs`). When runs do not ``continue`` from
    the states the last left (only a first run takes the prompt graph), a prompt longer than one run is not padded."""
    if not prompt_tokens or (not continues and length > prompt_tokens):
        return 0
    pad = -length % prompt_tokens
    return pad if length + pad + room <= capacity else 0


def padded_prompt(
    ids: torch.Tensor, mask: torch.Tensor, pad: int, image_token: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` [rows, length] and their ``mask`` with ``pad`` masked columns before them (:func:`prompt_padding`): the
    filler id is 0, or 1 when 0 is the ``image_token`` (a vision-language step places image features by the ids)."""
    if not pad:
        return ids, mask
    filler = 1 if image_token == 0 else 0
    rows = ids.shape[0]
    return (
        torch.cat([torch.full((rows, pad), filler, dtype=ids.dtype), ids], dim=1),
        torch.cat([torch.zeros(rows, pad, dtype=mask.dtype), mask], dim=1),
    )


def prompt_runs(length: int, chunk: int, prompt_tokens: int, continues: bool = True) -> list[tuple[int, int]]:
    """The (start, end) columns of each prefill run over a (padded) prompt of ``length`` tokens: chunks of ``chunk``
    (the context profile's longest), or, with a prompt graph of ``prompt_tokens`` per run, the leading tokens that
    fill no whole run one at a time (the one-token step's), then whole runs; when runs do not ``continue`` from the
    states, a first whole run (from zero states), then the other tokens one at a time."""
    if not prompt_tokens:
        return [(start, min(start + chunk, length)) for start in range(0, length, chunk)]
    if not continues:
        first = prompt_tokens if length >= prompt_tokens else 0
        return [(0, first)] * bool(first) + [(i, i + 1) for i in range(first, length)]
    single = length % prompt_tokens
    return [(i, i + 1) for i in range(single)] + [
        (start, start + prompt_tokens) for start in range(single, length, prompt_tokens)
    ]


class StepFeed:
    """``prefill()`` the prompt, then ``step(tokens)`` per new token; ``reorder(rows)`` moves the cache rows (beam
    search) between steps. Each returns the logits of the last position [rows, vocab].

    With a recurrent model's prompt graph (``prompt_tokens`` per run), the prompt is left-padded to whole runs when the
    cache leaves ``room`` for the new tokens after the padding (:func:`prompt_padding`): the padding is masked, as a
    padded batch's is, and holds cache positions (:attr:`prompt` counts them)."""

    def __init__(
        self,
        runner: StepRunner,
        ids: torch.Tensor,
        mask: torch.Tensor,
        capacity: int,
        chunk: int | None = None,
        window: int = 0,
        prompt_tokens: int = 0,
        room: int = 1,
        prompt_continues: bool = True,
    ) -> None:
        self.runner = runner
        self.window = window
        self.ids = ids
        rows = ids.shape[0]
        pad = prompt_padding(ids.shape[1], capacity, prompt_tokens, room, prompt_continues)
        ids, mask = padded_prompt(ids, mask, pad)
        self._prompt_ids = ids
        #: the cache positions the prompt takes (its tokens and any padding before them)
        self.prompt = ids.shape[1]
        self.chunk = chunk or capacity
        self.prompt_tokens = prompt_tokens
        self.prompt_continues = prompt_continues
        self.mask = torch.zeros(rows, capacity, dtype=torch.int64)
        self.mask[:, : self.prompt] = mask
        self.positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        self.next_position = self.positions[:, -1:] + 1
        self.steps = 0
        # numpy views of the mask and the next positions, written in place by each step: a decode step's host work
        # without torch's indexing (every runner copies its inputs into its own buffers, none keeps them)
        self._mask, self._next = self.mask.numpy(), self.next_position.numpy()
        runner.start(rows)

    @classmethod
    def of(
        cls, runner: StepRunner, ids: torch.Tensor, mask: torch.Tensor, generation: Any, run_tokens: int, room: int
    ) -> StepFeed:
        """The feed of a step converted with ``generation`` (its :class:`GenerationSettings`): its capacity, context
        profile and kept window; ``run_tokens``: its prompt graph's tokens per run (0: none runs the prompt)."""
        return cls(
            runner,
            ids,
            mask,
            generation.max_length,
            generation.max_prompt,
            generation.kept_window,
            run_tokens,
            room,
            generation.prompt_continues,
        )

    def prefill(self) -> torch.Tensor:
        """The prompt through the step (or the prompt graph), run by run (:func:`prompt_runs`); the last run's
        logits."""
        logits = torch.empty(0)
        for start, end in prompt_runs(self.prompt, self.chunk, self.prompt_tokens, self.prompt_continues):
            logits = self.runner.run(self._prompt_ids[:, start:end], self.mask, self.positions[:, start:end], start)
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One new token per row [rows] through the step."""
        past = self.prompt + self.steps
        self._mask[:, past] = 1
        evict(self._mask, self.prompt, past, self.window)
        logits = self.runner.run(tokens.unsqueeze(1), self.mask, self.next_position, past)
        self._next += 1  # next_position's memory
        self.steps += 1
        return logits

    def reorder(self, rows: torch.Tensor) -> None:
        """Row ``i`` of the cache becomes what row ``rows[i]`` was (the mask and positions are the same for every
        row of one prompt, and beams only move within their prompt)."""
        self.runner.reorder(rows)
