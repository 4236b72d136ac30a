"""Choosing the next token from a step's logits (``pipeline.runtime.generation.decoding``), each transform judged
against transformers' own logits processors on fixed logits (ties) and random batches."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from pipeline.runtime.generation.decoding import (
    DecodingOptions,
    TokenChooser,
    repetition_penalty,
    top_k_filter,
    top_p_filter,
)


def test_greedy_choice_takes_the_first_maximum_of_each_row_as_torch_does() -> None:
    """The greedy pick (numpy's argmax, off torch's intra-op threads) is torch's: the first of tied maxima, a row
    of its own per prompt, vocabularies over torch's parallel grain (32768 values) included."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 128256, generator=generator)
    logits[1, 7] = logits[1, 900] = 50.0  # a tie: the first wins
    logits[2, -1] = 60.0
    chosen = TokenChooser(DecodingOptions()).choose(logits, torch.zeros(4, 1, dtype=torch.int64))
    assert chosen.dtype == torch.int64 and chosen.shape == (4,)
    assert torch.equal(chosen, logits.argmax(dim=-1)) and chosen[1] == 7 and chosen[2] == 128255


def logits_cases() -> list[torch.Tensor]:
    """Fixed logits with ties (equal maxima, equal values across the top-k and top-p cut), negative and positive
    values, and random batches of a small and a large vocabulary."""
    tied = torch.tensor(
        [
            [2.0, 2.0, 1.0, 1.0, 1.0, -1.0, -3.0, 0.5],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [-5.0, 3.0, 3.0, -5.0, 1.0, 1.0, 1.0, 2.0],
            [10.0, -10.0, 9.0, 8.0, 8.0, 8.0, -1.0, -1.0],
        ]
    )
    generator = torch.Generator().manual_seed(11)
    return [tied, torch.randn(4, 50, generator=generator) * 3, torch.randn(3, 32000, generator=generator)]


def seen_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Tokens already generated per row, repeats included (transformers gathers them with repeats)."""
    generator = torch.Generator().manual_seed(12)
    return torch.randint(0, logits.shape[-1], (logits.shape[0], 9), generator=generator)


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.999, 1.0])
def test_top_p_keeps_what_transformers_keeps(case: int, top_p: float) -> None:
    """A user switching from transformers' generate expects the same nucleus: the same tokens kept (ties included),
    the same values for them."""
    logits = logits_cases()[case]
    theirs = TopPLogitsWarper(top_p)(seen_tokens(logits), logits.clone())
    ours = top_p_filter(logits, top_p) if top_p < 1.0 else logits
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("top_k", [1, 2, 3, 5, 50, 40000])
def test_top_k_keeps_what_transformers_keeps(case: int, top_k: int) -> None:
    logits = logits_cases()[case]
    theirs = TopKLogitsWarper(top_k)(seen_tokens(logits), logits.clone())
    assert torch.equal(top_k_filter(logits, top_k), theirs)


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 2.0])
def test_repetition_penalty_is_transformers_rule(case: int, penalty: float) -> None:
    """Seen tokens' positive logits divided, negative ones multiplied, repeats counted once; unseen ones untouched."""
    logits = logits_cases()[case]
    seen = seen_tokens(logits)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(seen, logits.clone())
    assert torch.equal(repetition_penalty(logits, seen, penalty), theirs)


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.5])
def test_the_chooser_draws_from_transformers_distribution(temperature: float) -> None:
    """The whole sampling choice: transformers' processors in transformers' order (repetition penalty, temperature,
    top-k, top-p), then a draw. The same generator state gives the same token as transformers' own
    softmax + multinomial over its processed scores."""
    for case, logits in enumerate(logits_cases()):
        seen = seen_tokens(logits)
        processors = LogitsProcessorList(
            [
                RepetitionPenaltyLogitsProcessor(1.2),
                TemperatureLogitsWarper(temperature),
                TopKLogitsWarper(5),
                TopPLogitsWarper(0.8),
            ]
        )
        scores = processors(seen, logits.clone())
        for seed in range(5):
            generator = torch.Generator().manual_seed(seed)
            theirs = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(1)
            options = DecodingOptions(True, temperature, 5, 0.8, 1.2, seed)
            ours = TokenChooser(options).choose(logits, seen)
            assert torch.equal(ours, theirs), (case, seed)
