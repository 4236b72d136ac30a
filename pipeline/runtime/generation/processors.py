"""The logits processors before the sampling warpers, as transformers' ``generate`` builds and orders them.

Each built-in is a function of ``(tokens [rows, seen], scores [rows, vocab]) -> scores`` doing what the transformers
class of the same purpose does, in transformers' order (``GenerationMixin._get_logits_processor``): the repetition
penalty, no-repeat n-grams, bad words, the minimum length, the minimum of new tokens. A user's
``logits_processor=`` (transformers' objects, or any callable of the same signature) is merged as transformers merges
it: one of the same class as a built-in takes its place, the others follow. The sampling warpers (temperature, top-k,
top-p) come after all of them (:class:`pipeline.runtime.generation.decoding.TokenChooser`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from pipeline.runtime.generation.decoding import repetition_penalty

Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class BuiltIn:
    """One built-in processor and the transformers class whose work it does (a user's processor of that class takes
    its place)."""

    name: str
    apply: Processor


class ScoreProcessors:
    """The built-ins in order, merged with a user's ``logits_processor`` list; called as transformers'
    ``LogitsProcessorList``: ``processors(tokens, scores) -> scores``."""

    def __init__(self, built_ins: Sequence[BuiltIn] = (), user: Sequence[Any] | None = None) -> None:
        user = list(user or ())
        merged: list[Any] = []
        for built_in in built_ins:
            custom = next((p for p in user if type(p).__name__ == built_in.name), None)
            merged.append(built_in.apply if custom is None else custom)
        merged += [p for p in user if not any(p is q for q in merged)]
        self.processors = merged

    def __call__(self, tokens: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for processor in self.processors:
            scores = processor(tokens, scores)
        return scores

    def __bool__(self) -> bool:
        return bool(self.processors)


def score_processors(
    options: Any,
    prompt: int,
    padding: torch.Tensor | None,
    eos: Sequence[int],
    user: Sequence[Any] | None = None,
    max_length: int | None = None,
) -> ScoreProcessors:
    """The processors ``options`` (:class:`GenerateOptions` or :class:`DecodingOptions`) ask for, for a prompt of
    ``prompt`` tokens (padding included) whose rows start with ``padding`` pad tokens (``None``: no padding), and a
    decoding of ``max_length`` tokens in all (the forced eos comes last)."""
    built_ins = []
    penalty = getattr(options, "repetition_penalty", None)
    if penalty is not None and penalty != 1.0:
        apply = partial(_penalise, penalty=penalty, padding=padding)
        built_ins.append(BuiltIn("RepetitionPenaltyLogitsProcessor", apply))
    ngram = getattr(options, "no_repeat_ngram_size", None)
    if ngram:
        built_ins.append(BuiltIn("NoRepeatNGramLogitsProcessor", partial(no_repeat_ngram, size=ngram)))
    bad_words = getattr(options, "bad_words_ids", None)
    if bad_words:
        built_ins.append(BuiltIn("NoBadWordsLogitsProcessor", bad_words_filter(bad_words, eos)))
    min_length = getattr(options, "min_length", None)
    min_new = getattr(options, "min_new_tokens", None)
    if min_new is not None:  # transformers: min_new_tokens takes precedence, as min_length counted from the prompt
        min_length = prompt + min_new
    if min_length and eos:
        built_ins.append(BuiltIn("MinLengthLogitsProcessor", partial(forbid_eos, eos=eos, before=min_length)))
    if min_new and eos:
        apply = partial(forbid_eos, eos=eos, before=prompt + min_new)
        built_ins.append(BuiltIn("MinNewTokensLengthLogitsProcessor", apply))
    built_ins += _forced_and_suppressed(options, prompt, max_length)
    return ScoreProcessors(built_ins, user)


def _forced_and_suppressed(options: Any, prompt: int, max_length: int | None) -> list[BuiltIn]:
    """transformers' forced-token and suppression processors, in its order: the forced first token (at length 1),
    the forced last token (at ``max_length - 1``), the tokens always suppressed, those suppressed at the first
    generated position."""
    built_ins = []
    bos = getattr(options, "forced_bos_token_id", None)
    if bos is not None:
        built_ins.append(BuiltIn("ForcedBOSTokenLogitsProcessor", partial(force_tokens, ids=(bos,), at=1)))
    eos = getattr(options, "forced_eos_token_id", None)
    if eos is not None and max_length is not None:
        forced = tuple(eos) if isinstance(eos, list | tuple) else (eos,)
        apply = partial(force_tokens, ids=forced, at=max_length - 1)
        built_ins.append(BuiltIn("ForcedEOSTokenLogitsProcessor", apply))
    suppressed = getattr(options, "suppress_tokens", None)
    if suppressed:
        apply = partial(suppress, ids=tuple(suppressed), at=None)
        built_ins.append(BuiltIn("SuppressTokensLogitsProcessor", apply))
    at_begin = getattr(options, "begin_suppress_tokens", None)
    if at_begin:
        begin = prompt if prompt > 1 or bos is None else prompt + 1
        apply = partial(suppress, ids=tuple(at_begin), at=begin)
        built_ins.append(BuiltIn("SuppressTokensAtBeginLogitsProcessor", apply))
    return built_ins


def force_tokens(tokens: torch.Tensor, scores: torch.Tensor, ids: Sequence[int], at: int) -> torch.Tensor:
    """Only ``ids`` possible (score 0, every other -inf) when the rows hold ``at`` tokens (transformers'
    ``ForcedBOSTokenLogitsProcessor`` at 1, ``ForcedEOSTokenLogitsProcessor`` at ``max_length - 1``)."""
    if tokens.shape[-1] != at:
        return scores
    forced = torch.full_like(scores, -math.inf)
    forced[:, list(ids)] = 0
    return forced


def suppress(tokens: torch.Tensor, scores: torch.Tensor, ids: Sequence[int], at: int | None) -> torch.Tensor:
    """``ids`` at -inf: always (``at`` None: transformers' ``SuppressTokensLogitsProcessor``), or when the rows hold
    ``at`` tokens (``SuppressTokensAtBeginLogitsProcessor``)."""
    if at is not None and tokens.shape[-1] != at:
        return scores
    vocab = torch.arange(scores.shape[-1], device=scores.device)
    return torch.where(torch.isin(vocab, torch.tensor(list(ids), device=scores.device)), -math.inf, scores)


def _penalise(tokens: torch.Tensor, scores: torch.Tensor, penalty: float, padding: torch.Tensor | None) -> torch.Tensor:
    return repetition_penalty(scores, tokens, penalty, padding)


def forbid_eos(tokens: torch.Tensor, scores: torch.Tensor, eos: Sequence[int], before: int) -> torch.Tensor:
    """The eos tokens' scores -inf while the rows hold fewer than ``before`` tokens (transformers'
    ``MinLengthLogitsProcessor``; ``MinNewTokensLengthLogitsProcessor`` is the same with the prompt added)."""
    if tokens.shape[-1] >= before:
        return scores
    is_eos = torch.isin(torch.arange(scores.shape[-1], device=scores.device), torch.tensor(list(eos)))
    return torch.where(is_eos, -math.inf, scores)


def no_repeat_ngram(tokens: torch.Tensor, scores: torch.Tensor, size: int) -> torch.Tensor:
    """Every token that would complete an n-gram of ``size`` already in the row (prompt included) gets -inf, as
    transformers' ``NoRepeatNGramLogitsProcessor``: the last ``size - 1`` tokens are matched against every window."""
    seen = tokens.shape[-1]
    if seen < size:
        return scores
    prefix = tokens[:, seen + 1 - size :]
    windows = tokens.unfold(dimension=1, size=size, step=1)
    matches = (windows[..., :-1] == prefix.unsqueeze(1)).all(dim=-1)
    vocab = scores.shape[-1]
    banned = scores.new_zeros((scores.shape[0], vocab + 1), dtype=torch.bool)  # a spare column for non-matches
    banned.scatter_(1, torch.where(matches, windows[..., -1].clamp(max=vocab), vocab), True)
    return scores.masked_fill(banned[:, :vocab], -math.inf)


def bad_words_filter(words: Sequence[Sequence[int]], eos: Sequence[int]) -> Processor:
    """transformers' ``NoBadWordsLogitsProcessor``: a word's last token gets -inf in the rows that end with the rest
    of it (a one-token word: always); a one-token word that is an eos token is not banned (the eos stays
    reachable)."""
    kept = list(dict.fromkeys(tuple(w) for w in words if not (len(w) == 1 and w[0] in eos)))
    single = [word[0] for word in kept if len(word) == 1]
    longer = [word for word in kept if len(word) > 1]

    def apply(tokens: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        bias = torch.zeros_like(scores)
        bias[..., single] = -math.inf
        for word in longer:
            prefix = torch.tensor(word[:-1], device=tokens.device)
            if len(prefix) > tokens.shape[1]:  # the prefix is longer than the context
                continue
            ends_with = (tokens[:, tokens.shape[1] - len(prefix) :] == prefix).all(dim=-1)
            bias[:, word[-1]] += torch.where(ends_with, -math.inf, 0.0).to(bias.dtype)
        return scores + bias  # transformers adds its bias: -inf stays -inf, the other scores add 0

    return apply


class UserCriteria:
    """A user's ``stopping_criteria`` (transformers' ``StoppingCriteriaList``, a list of criteria, or one callable) as
    one callable ``(tokens, scores) -> done [rows]``, called after each token as transformers calls them."""

    def __init__(self, criteria: Any) -> None:
        self.criteria = list(criteria) if isinstance(criteria, list | tuple) else [criteria]

    def __call__(self, tokens: torch.Tensor, scores: Any) -> torch.Tensor:
        done = torch.zeros(tokens.shape[0], dtype=torch.bool)
        for criterion in self.criteria:
            done = done | torch.as_tensor(criterion(tokens, scores)).cpu()
        return done

    @property
    def stop_at_eos(self) -> bool:
        """Whether a criterion stops at an eos token (transformers then pads finished rows, as for its own eos)."""
        return any(hasattr(criterion, "eos_token_id") for criterion in self.criteria)


def user_criteria(criteria: Any) -> UserCriteria | None:
    """:class:`UserCriteria` of ``criteria``, ``None`` when there are none."""
    if criteria is None or (isinstance(criteria, list | tuple) and not criteria):
        return None
    return UserCriteria(criteria)
