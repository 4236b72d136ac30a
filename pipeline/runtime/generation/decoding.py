"""Choosing the next token from a step's logits, as transformers' ``generate`` does.

The order is transformers': the repetition penalty on the raw logits, then (sampling only) temperature, top-k and
top-p, then argmax or a draw. Seeded draws use their own ``torch.Generator``: the same seed gives the same tokens
on every backend (not the tokens transformers draws from the global generator).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from converters.errors import InputError


@dataclass(frozen=True)
class DecodingOptions:
    """How the next token is chosen (``generate``'s keyword arguments of the same names)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise InputError(f"temperature must be > 0, got {self.temperature}", fix="pass e.g. temperature=0.7")
        if self.top_k is not None and self.top_k < 1:
            raise InputError(f"top_k must be >= 1, got {self.top_k}", fix="pass e.g. top_k=50, or None")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}", fix="pass e.g. top_p=0.9, or None")
        if self.repetition_penalty is not None and self.repetition_penalty <= 0:
            raise InputError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}", fix="pass e.g. 1.2, or None"
            )


class TokenChooser:
    """``choose(logits [B, vocab], tokens [B, seen])`` -> the next tokens [B] (int64).

    ``processors`` (``(tokens, scores) -> scores``, :mod:`pipeline.runtime.generation.processors`) run on the logits
    before the sampling warpers; without them, the repetition penalty of ``options`` does. ``record``: the processed
    scores of every step are kept in :attr:`scores` (transformers' ``output_scores``), the raw logits in
    :attr:`logits`."""

    def __init__(
        self,
        options: DecodingOptions,
        processors: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        record: bool = False,
    ) -> None:
        self.options = options
        penalty = options.repetition_penalty
        if processors is None and penalty is not None and penalty != 1.0:
            processors = functools.partial(_penalise, penalty=penalty)
        self.processors = processors
        self.scores: list[torch.Tensor] | None = [] if record else None
        self.logits: list[torch.Tensor] | None = [] if record else None
        self.generator: torch.Generator | None = None
        self._argmax_only = not options.do_sample and processors is None and not record
        if options.do_sample:
            self.generator = torch.Generator()
            self.generator.manual_seed(options.seed if options.seed is not None else torch.seed())

    def choose(self, logits: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """The next token of every row (``tokens``, the rows so far, may be ``None`` when there are no
        :attr:`processors`: nothing else reads them)."""
        if self._argmax_only and logits.dtype == torch.float32 and logits.is_cpu:
            # greedy, nothing to process or record (the common case): the argmax method of the logits' array and no
            # more (each library call is paid again after every step's run, which leaves the caches cold)
            chosen = logits.numpy().argmax(-1)
            return torch.from_numpy(chosen if chosen.dtype == np.int64 else chosen.astype(np.int64))
        scores = logits.float()
        if self.logits is not None:
            self.logits.append(scores.clone())  # a user's processor may write its scores in place
        if self.processors is not None:
            if tokens is None:
                raise InputError("the logits processors need the rows' tokens", fix="pass choose(logits, tokens)")
            scores = self.processors(tokens, scores)
        if self.options.do_sample:
            scores = self._warp(scores)
        if self.scores is not None:
            self.scores.append(scores)
        if not self.options.do_sample:
            # numpy's argmax (the first maximum, as torch's): torch's runs on its intra-op threads for a batch of
            # logits over 32768 values, which then spin on the cores ONNX Runtime's next step needs (measured at 2
            # threads, batch 4: a 13.7 ms step took 18.0 ms in the loop; 15.6 ms with numpy's or one torch thread)
            if scores.device.type != "cpu":
                return scores.argmax(dim=-1)
            return torch.from_numpy(np.argmax(scores.numpy(), axis=-1).astype(np.int64, copy=False))
        probabilities = torch.softmax(scores, dim=-1)
        return torch.multinomial(probabilities, 1, generator=self.generator).squeeze(1)

    def _warp(self, scores: torch.Tensor) -> torch.Tensor:
        """The sampling warpers in transformers' order: temperature, top-k, top-p."""
        scores = scores / self.options.temperature
        if self.options.top_k is not None:
            scores = top_k_filter(scores, self.options.top_k)
        if self.options.top_p is not None and self.options.top_p < 1.0:
            scores = top_p_filter(scores, self.options.top_p)
        return scores


def _penalise(tokens: torch.Tensor, scores: torch.Tensor, penalty: float) -> torch.Tensor:
    return repetition_penalty(scores, tokens, penalty)


def repetition_penalty(
    scores: torch.Tensor, tokens: torch.Tensor, penalty: float, padding: torch.Tensor | None = None
) -> torch.Tensor:
    """transformers' rule: the logit of every token seen so far divided by ``penalty`` (multiplied when negative).
    ``padding`` [rows]: the left padding of each row, whose tokens are not counted as seen (transformers'
    ``prompt_ignore_length``, which ``generate`` sets from a padded attention mask)."""
    if padding is not None:
        vocab = scores.shape[-1]
        # the padding's tokens go to a spare column past the vocabulary, dropped after the scatter
        tokens = tokens.masked_fill(torch.arange(tokens.shape[1]) < padding[:, None], vocab)
        return repetition_penalty(torch.nn.functional.pad(scores, (0, 1)), tokens, penalty)[..., :vocab]
    seen = torch.gather(scores, 1, tokens)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return scores.scatter(1, tokens, seen)


def top_k_filter(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Only the ``k`` highest logits of each row stay finite."""
    k = min(k, scores.shape[-1])
    threshold = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < threshold, float("-inf"))


def top_p_filter(scores: torch.Tensor, p: float) -> torch.Tensor:
    """The smallest set of tokens whose probability reaches ``p`` stays (at least one token), as transformers."""
    ordered, order = torch.sort(scores, descending=False)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - p)
    remove[..., -1:] = False
    return scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
