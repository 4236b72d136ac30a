"""The checks of ``DecodingOptions`` and the paths of ``TokenChooser`` the transformers comparisons of test_decoding.py
do not take (bad options, the penalty in greedy decoding, the chooser's own generator), with hand-made logits."""

from __future__ import annotations

import pytest
import torch

from converters.errors import InputError
from pipeline.runtime.generation.decoding import DecodingOptions, TokenChooser


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"temperature": 0.0}, ["temperature must be > 0, got 0.0", "temperature=0.7"]),
        ({"temperature": -1.0}, ["temperature must be > 0, got -1.0"]),
        ({"top_k": 0}, ["top_k must be >= 1, got 0", "top_k=50, or None"]),
        ({"top_k": -3}, ["top_k must be >= 1, got -3"]),
        ({"top_p": 0.0}, ["top_p must be in (0, 1], got 0.0", "top_p=0.9, or None"]),
        ({"top_p": 1.5}, ["top_p must be in (0, 1], got 1.5"]),
        ({"top_p": -0.5}, ["top_p must be in (0, 1], got -0.5"]),
        ({"repetition_penalty": 0.0}, ["repetition_penalty must be > 0, got 0.0", "pass e.g. 1.2, or None"]),
        ({"repetition_penalty": -1.2}, ["repetition_penalty must be > 0, got -1.2"]),
    ],
)
def test_a_bad_option_is_an_input_error_naming_it_and_the_fix(options: dict[str, float], words: list[str]) -> None:
    with pytest.raises(InputError) as info:
        DecodingOptions(do_sample=True, **options)
    text = str(info.value)
    assert text.startswith("[input] ") and "\n  fix: pass e.g. " in text
    for word in words:
        assert word in text, (word, text)


def test_the_edges_of_each_range_are_accepted() -> None:
    for options in (
        {"temperature": 1e-6},
        {"top_k": 1},
        {"top_p": 1.0},
        {"top_p": 1e-6},
        {"repetition_penalty": 1e-6},
        {"top_k": None, "top_p": None, "repetition_penalty": None},
    ):
        DecodingOptions(do_sample=True, **options)  # type: ignore[arg-type]


def test_greedy_decoding_applies_the_repetition_penalty_first() -> None:
    """Greedy: the seen token's logit 4 divided by 2 falls below the unseen 3; a negative seen logit is multiplied. A
    penalty of 1 (or none) changes nothing."""
    logits = torch.tensor([[4.0, 3.0, -1.0, -1.5], [-1.0, -1.5, -3.0, -4.0]])
    seen = torch.tensor([[0], [0]])
    assert TokenChooser(DecodingOptions(repetition_penalty=2.0)).choose(logits, seen).tolist() == [1, 1]
    for penalty in (None, 1.0):
        assert TokenChooser(DecodingOptions(repetition_penalty=penalty)).choose(logits, seen).tolist() == [0, 0]
    # 0.5 rewards what was seen: 1 -> 2 beats an unseen 1.5, while -1 -> -0.5 still loses to -0.4
    logits = torch.tensor([[1.0, 1.5, -0.4], [-1.0, -0.4, -3.0]])
    chosen = TokenChooser(DecodingOptions(repetition_penalty=0.5)).choose(logits, torch.tensor([[0], [0]]))
    assert chosen.tolist() == [0, 1]


def test_greedy_decoding_keeps_no_generator_and_sampling_seeds_its_own() -> None:
    assert TokenChooser(DecodingOptions()).generator is None
    chooser = TokenChooser(DecodingOptions(do_sample=True, seed=1234))
    assert chooser.generator is not None and chooser.generator.initial_seed() == 1234
    unseeded = TokenChooser(DecodingOptions(do_sample=True))
    assert unseeded.generator is not None and unseeded.generator is not chooser.generator


def test_sampling_draws_only_what_top_k_and_top_p_keep() -> None:
    """Two likely tokens and many unlikely ones: top_k=2 (or top_p=0.5 of a 0.6/0.3 split) never draws a third."""
    logits = torch.full((8, 50), -2.0)
    logits[:, 7], logits[:, 3] = 3.0, 2.3
    seen = torch.zeros(8, 1, dtype=torch.int64)
    for options in (DecodingOptions(True, top_k=2, seed=0), DecodingOptions(True, top_k=1, seed=0)):
        drawn = torch.cat([TokenChooser(options).choose(logits, seen) for _ in range(20)])
        assert drawn.shape == (160,) and drawn.dtype == torch.int64
        allowed = {7, 3} if options.top_k == 2 else {7}
        assert set(drawn.tolist()) == allowed
    drawn = torch.cat([TokenChooser(DecodingOptions(True, top_p=0.5, seed=s)).choose(logits, seen) for s in range(20)])
    assert set(drawn.tolist()) == {7}
    # a low temperature sharpens: at 0.05 the 0.7 gap is 14 nats, the second token is (practically) never drawn
    drawn = torch.cat([TokenChooser(DecodingOptions(True, 0.05, seed=s)).choose(logits, seen) for s in range(20)])
    assert set(drawn.tolist()) == {7}
    # with neither filter, a high temperature draws the unlikely tokens too
    drawn = torch.cat([TokenChooser(DecodingOptions(True, 5.0, seed=s)).choose(logits, seen) for s in range(5)])
    assert len(set(drawn.tolist()) - {3, 7}) > 5


def test_greedy_choice_on_the_cpu_is_numpys_argmax_and_elsewhere_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU the pick is numpy's (torch's argmax would wake its intra-op threads, which then spin on the cores
    the next step needs: decoding.py); logits on another device (here "meta", which has no data) stay there."""
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, -1.0, 3.0]])
    seen = torch.zeros(2, 1, dtype=torch.int64)

    def no_torch_argmax(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch's argmax on the CPU")

    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "argmax", no_torch_argmax)
        assert TokenChooser(DecodingOptions()).choose(logits, seen).tolist() == [1, 0]
    elsewhere = TokenChooser(DecodingOptions()).choose(torch.empty(3, 7, device="meta"), seen)
    assert elsewhere.device.type == "meta" and elsewhere.shape == (3,) and elsewhere.dtype == torch.int64
