"""The greedy and sampled decoding loop (``pipeline.runtime.generation.module.decode``) over a scripted feed, against
the plain loop it replaced (the sequences concatenated each step, every row padded and tested by torch each step):
the same tokens, the same stops and padding, and the same ``tokens`` handed to processors and criteria, which may
keep them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from converters.errors import InputError
from pipeline.runtime.generation.decoding import DecodingOptions, TokenChooser
from pipeline.runtime.generation.module import decode
from pipeline.runtime.generation.processors import ScoreProcessors, UserCriteria
from pipeline.runtime.generation.request import Decoding

VOCAB = 12


class ScriptedFeed:
    """Logits drawn from a seeded generator: the prefill's, then one set per step (the token fed is recorded)."""

    def __init__(self, ids: torch.Tensor, seed: int) -> None:
        self.ids = ids
        self.generator = torch.Generator().manual_seed(seed)
        self.fed: list[torch.Tensor] = []

    def _logits(self) -> torch.Tensor:
        return torch.randn(self.ids.shape[0], VOCAB, generator=self.generator)

    def prefill(self) -> torch.Tensor:
        return self._logits()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.fed.append(tokens.clone())
        return self._logits()

    def reorder(self, rows: torch.Tensor) -> None:
        raise AssertionError("not a beam search")


def reference_decode(feed: ScriptedFeed, decoding: Decoding) -> Iterator[torch.Tensor]:
    """The loop as it was before the per-step host work was cut (issue 35)."""
    logits = feed.prefill()
    tokens, unfinished = feed.ids, torch.ones(feed.ids.shape[0], dtype=torch.bool)
    for step in range(decoding.new):
        chosen = decoding.chooser.choose(logits, tokens)
        if decoding.pad is not None:
            chosen = torch.where(unfinished, chosen, torch.tensor(decoding.pad))
        tokens = torch.cat([tokens, chosen[:, None]], dim=1)
        yield chosen
        unfinished &= ~decoding.stops(tokens)
        if step == decoding.new - 1 or not unfinished.any():
            return
        logits = feed.step(chosen)


class Keeping:
    """A processor or criterion that keeps every ``tokens`` it is given (and stops rows whose last token is 3)."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []

    def __call__(self, tokens: torch.Tensor, scores: Any) -> torch.Tensor:
        self.kept.append(tokens)
        return scores if isinstance(scores, torch.Tensor) else tokens[:, -1] == 3


def decoding_of(case: dict[str, Any], processor: Keeping | None, criterion: Keeping | None) -> Decoding:
    options = DecodingOptions(do_sample=case.get("do_sample", False), seed=0)
    processors = ScoreProcessors((), [processor] if processor is not None else None)
    chooser = TokenChooser(options, processors if processors else None)
    criteria = UserCriteria([criterion]) if criterion is not None else None
    return Decoding(case.get("new", 9), case.get("eos", ()), case.get("pad"), chooser, processors, criteria)


CASES = [
    {},
    {"eos": (4,), "pad": 0},
    {"eos": (4, 7, 9), "pad": 11},
    {"eos": (4, 7), "pad": None},
    {"eos": (1, 2, 4, 5, 7), "pad": 0, "new": 20},
    {"do_sample": True, "eos": (2, 5), "pad": 0, "new": 20},
    {"processor": True},
    {"processor": True, "eos": (4, 7), "pad": 0},
    {"criterion": True, "pad": 0},
    {"criterion": True, "processor": True, "eos": (5,), "pad": 5, "new": 20},
]


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_the_loop_gives_what_the_plain_loop_gave(case: dict[str, Any], rows: int) -> None:
    ids = torch.randint(0, VOCAB, (rows, 5), generator=torch.Generator().manual_seed(rows))
    runs = []
    for loop in (reference_decode, decode):
        for seed in range(6):
            processor = Keeping() if case.get("processor") else None
            criterion = Keeping() if case.get("criterion") else None
            feed = ScriptedFeed(ids, seed)
            chosen = [tokens.clone() for tokens in loop(feed, decoding_of(case, processor, criterion))]
            kept = [[t.tolist() for t in keeper.kept] for keeper in (processor, criterion) if keeper is not None]
            contiguous = [t.is_contiguous() for keeper in (processor, criterion) if keeper for t in keeper.kept]
            runs.append((loop, [c.tolist() for c in chosen], [f.tolist() for f in feed.fed], kept, contiguous))
    reference, ours = runs[: len(runs) // 2], runs[len(runs) // 2 :]
    for (_, *expected), (_, *actual) in zip(reference, ours, strict=True):
        assert actual == expected  # tokens, tokens fed, what processors and criteria kept (read after the loop)
    if case.get("eos"):  # the cases stop or pad somewhere
        assert any(len(run[1]) < case.get("new", 9) or rows > 1 for run in ours)


def test_greedy_without_processors_needs_no_tokens() -> None:
    """The chooser's common case (greedy, nothing processed or recorded) takes the logits alone."""
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 2.0, -1.0]])
    assert TokenChooser(DecodingOptions()).choose(logits).tolist() == [1, 0]
    with pytest.raises(InputError, match="need the rows' tokens"):
        TokenChooser(DecodingOptions(repetition_penalty=1.5)).choose(logits)
