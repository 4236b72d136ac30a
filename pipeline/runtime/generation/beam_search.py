"""Beam search as transformers' ``_beam_search`` scores and orders it (transformers 5's vectorised form).

Every prompt decodes ``num_beams`` rows (the prompt repeated, rows ``b * num_beams + k``). At each step the
processed log-probabilities of every beam's next token are added to the beam's running score; the best
``beams_to_keep = max(2, 1 + eos tokens) * num_beams`` continuations of each prompt are kept; those that end (an eos
token, the length limit, a user's criterion) among the top ``num_beams`` are scored ``sum of log-probs / new
tokens ** length_penalty`` into the finished set, the best ``num_beams`` others run on, and the cache rows follow
them (:meth:`StepRunner.reorder`). ``early_stopping`` as transformers: ``True`` stops a prompt once ``num_beams``
sequences are finished, ``False`` once no running beam could still beat the worst finished one at its current length,
``"never"`` once none could at the longest length (with a positive length penalty).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.runtime.generation.feed import Feed

#: transformers' score of what may not be chosen.
_LOW = -1.0e9


@dataclass(frozen=True)
class BeamSettings:
    """The beam options of one ``generate`` call."""

    num_beams: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1


@dataclass
class BeamResult:
    """transformers' beam output fields: the best ``num_return_sequences`` sequences per prompt (prompt included,
    cut at the longest), their length-penalised scores, every step's processed scores [rows, vocab] and raw logits,
    and the rows each token came from per step."""

    sequences: torch.Tensor
    sequences_scores: torch.Tensor
    scores: tuple[torch.Tensor, ...]
    logits: tuple[torch.Tensor, ...]
    beam_indices: torch.Tensor


def beam_search(
    feed: Feed,
    settings: BeamSettings,
    new_tokens: int,
    processors: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    criteria: Callable[[torch.Tensor, Any], torch.Tensor] | None,
    eos: tuple[int, ...],
    fill: int,
    record: bool = False,
) -> BeamResult:
    """Decode ``feed``'s prompt rows (each prompt repeated ``num_beams`` times) with beams, up to ``new_tokens``;
    ``fill`` is the token after a finished sequence's end (transformers': ``pad_token_id or eos_token_id[0]``).
    ``record``: keep every step's scores and logits (transformers' ``output_scores``/``output_logits``; the user's
    criteria see the scores then, else ``None``, as in transformers)."""
    beams = settings.num_beams
    rows, prompt = feed.ids.shape
    batch, max_length = rows // beams, prompt + new_tokens
    state = _State(feed.ids.view(batch, beams, prompt), max_length, fill, len(eos), beams)
    eos_ids = torch.tensor(eos, dtype=torch.int64)
    scores: list[torch.Tensor] = []
    raw: list[torch.Tensor] = []
    logits = feed.prefill()
    cur_len = prompt
    while True:
        logits = logits.float()
        log_probs = torch.log_softmax(logits, dim=-1)
        if processors is not None:
            log_probs = processors(state.running[:, :, :cur_len].reshape(rows, cur_len), log_probs)
        if record:
            raw.append(logits.clone())
            scores.append(log_probs.clone())
        candidates = state.continuations(log_probs, cur_len, prompt)
        seen = tuple(scores) if record else None
        done = _stopping(candidates[1][:, :, : cur_len + 1], max_length, eos_ids, criteria, seen)
        state.advance(candidates, done, cur_len, prompt, settings)
        cur_len += 1
        if not state.unfinished(done, cur_len, max_length, prompt, settings):
            break
        feed.reorder(state.running_indices[..., cur_len - 1 - prompt].reshape(rows).to(torch.int64))
        logits = feed.step(state.running[:, :, cur_len - 1].reshape(rows))
    return state.result(settings.num_return_sequences, prompt, tuple(scores), tuple(raw))


def _stopping(
    sequences: torch.Tensor,
    max_length: int,
    eos: torch.Tensor,
    criteria: Callable[[torch.Tensor, Any], torch.Tensor] | None,
    scores: tuple[torch.Tensor, ...] | None,
) -> torch.Tensor:
    """Which candidates end with their last token [batch, candidates]: transformers' max-length and eos criteria,
    then the user's."""
    batch, candidates, length = sequences.shape
    done = torch.full((batch, candidates), length >= max_length, dtype=torch.bool)
    if len(eos):
        done |= torch.isin(sequences[:, :, -1], eos)
    if criteria is not None:
        done |= criteria(sequences.reshape(batch * candidates, length), scores).view(batch, candidates)
    return done


class _State:
    """transformers' beam tensors: running sequences, scores and row indices [batch, beams, ...]; the finished
    ones likewise; which prompts could still improve."""

    def __init__(self, prompts: torch.Tensor, max_length: int, fill: int, eos_tokens: int, beams: int) -> None:
        batch, _, prompt = prompts.shape
        self.running = torch.full((batch, beams, max_length), fill, dtype=torch.int64)
        self.running[:, :, :prompt] = prompts
        self.sequences = self.running.clone()
        self.running_scores = torch.zeros((batch, beams))
        self.running_scores[:, 1:] = _LOW  # only the first beam's tokens at the first step: no copies of one token
        self.beam_scores = torch.full((batch, beams), _LOW)
        self.finished = torch.zeros((batch, beams), dtype=torch.bool)
        self.improvable = torch.ones((batch, 1), dtype=torch.bool)
        self.running_indices = torch.full((batch, beams, max_length - prompt), -1, dtype=torch.int32)
        self.beam_indices = self.running_indices.clone()
        self.keep = max(2, 1 + eos_tokens) * beams
        self.top_beams = torch.arange(self.keep) < beams

    def continuations(
        self, log_probs: torch.Tensor, cur_len: int, prompt: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The best ``keep`` continuations of each prompt: their scores, sequences and row indices."""
        batch, beams = self.running_scores.shape
        vocab = log_probs.shape[-1]
        total = (log_probs.view(batch, beams, vocab) + self.running_scores[:, :, None]).reshape(batch, beams * vocab)
        top_scores, top = torch.topk(total, k=self.keep)
        beam = top // vocab
        indices = _gather(self.running_indices, beam)
        sequences = _gather(self.running, beam)
        sequences[:, :, cur_len] = top % vocab
        indices[:, :, cur_len - prompt] = (beam + torch.arange(batch).view(-1, 1) * beams).to(indices.dtype)
        return top_scores, sequences, indices

    def advance(
        self,
        candidates: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        done: torch.Tensor,
        cur_len: int,
        prompt: int,
        settings: BeamSettings,
    ) -> None:
        """The running beams for the next step (the best that did not end) and the finished set updated."""
        top_scores, sequences, indices = candidates
        beams = settings.num_beams
        running = top_scores + done.to(torch.float32) * _LOW
        best = torch.topk(running, k=beams)[1]
        self.running = _gather(sequences, best)
        self.running_scores = _gather(running, best)
        self.running_indices = _gather(indices, best)

        just_finished = done & self.top_beams[None, :]
        finished_scores = top_scores / ((cur_len + 1 - prompt) ** settings.length_penalty)
        full = torch.all(self.finished, dim=-1, keepdim=True) & (settings.early_stopping is True)
        finished_scores = finished_scores + full.to(torch.float32) * _LOW
        finished_scores = finished_scores + (~self.improvable).to(torch.float32) * _LOW
        finished_scores = finished_scores + (~just_finished) * _LOW
        merged_scores = torch.cat((self.beam_scores, finished_scores), dim=1)
        keep = torch.topk(merged_scores, k=beams)[1]
        self.sequences = _gather(torch.cat((self.sequences, sequences), dim=1), keep)
        self.beam_scores = _gather(merged_scores, keep)
        self.beam_indices = _gather(torch.cat((self.beam_indices, indices), dim=1), keep)
        self.finished = _gather(torch.cat((self.finished, just_finished), dim=1), keep)

    def unfinished(
        self, done: torch.Tensor, cur_len: int, max_length: int, prompt: int, settings: BeamSettings
    ) -> bool:
        """Whether another step could change the result (transformers' early-stop heuristic and stop condition)."""
        if settings.early_stopping == "never" and settings.length_penalty > 0.0:
            best_length = max_length - prompt
        else:
            best_length = cur_len - prompt
        best_running = self.running_scores[:, :1] / (best_length**settings.length_penalty)
        worst_finished = torch.where(self.finished, torch.min(self.beam_scores, dim=1, keepdim=True)[0], _LOW)
        self.improvable = self.improvable & torch.any(best_running > worst_finished, dim=-1, keepdim=True)
        open_beam = not (bool(torch.all(self.finished)) and settings.early_stopping is True)
        return bool(torch.any(self.improvable)) and open_beam and not bool(torch.all(done))

    def result(
        self, count: int, prompt: int, scores: tuple[torch.Tensor, ...], logits: tuple[torch.Tensor, ...]
    ) -> BeamResult:
        """The best ``count`` finished sequences per prompt, cut to the longest generated."""
        sequences = self.sequences[:, :count].flatten(0, 1)
        beam_scores = self.beam_scores[:, :count].flatten(0, 1)
        indices = self.beam_indices[:, :count].flatten(0, 1)
        generated = int((indices + 1).bool().sum(dim=1).max())
        return BeamResult(sequences[:, : prompt + generated], beam_scores, scores, logits, indices[:, :generated])


def _gather(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``tensor`` [batch, beams, ...] at ``indices`` [batch, k] along the beams."""
    while indices.dim() < tensor.dim():
        indices = indices.unsqueeze(-1)
    return torch.take_along_dim(tensor, indices, dim=1)
