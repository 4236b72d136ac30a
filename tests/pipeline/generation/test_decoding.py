"""Choosing the next token from a step's logits (``pipeline.runtime.generation.decoding``)."""

from __future__ import annotations

import torch

from pipeline.runtime.generation.decoding import DecodingOptions, TokenChooser


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
