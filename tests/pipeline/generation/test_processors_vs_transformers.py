"""The logits processors of ``pipeline.runtime.generation.processors`` judged against transformers' own classes:
no-repeat n-grams, bad words, the minimum (new) length, the repetition penalty over a padded prompt, and the whole
chain in transformers' order with a user's processors merged in. Fixed logits with ties and random batches, token
histories with many repeats (a small alphabet) so that the bans bite."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from pipeline.runtime.generation.decoding import DecodingOptions, TokenChooser, repetition_penalty
from pipeline.runtime.generation.options import GenerateOptions
from pipeline.runtime.generation.processors import (
    bad_words_filter,
    forbid_eos,
    no_repeat_ngram,
    score_processors,
    user_criteria,
)


def logits_cases() -> list[torch.Tensor]:
    """Ties (equal maxima, a row of zeros), negative and positive values, a +inf-free -inf entry, and random batches
    of a small and a large vocabulary; every case has 4 rows (the histories' batch)."""
    tied = torch.tensor(
        [
            [2.0, 2.0, 1.0, 1.0, 1.0, -1.0, -3.0, 0.5, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [-5.0, 3.0, 3.0, -5.0, 1.0, 1.0, 1.0, 2.0, -float("inf"), 4.0],
            [10.0, -10.0, 9.0, 8.0, 8.0, 8.0, -1.0, -1.0, 2.0, 2.0],
        ]
    )
    generator = torch.Generator().manual_seed(21)
    return [tied, torch.randn(4, 50, generator=generator) * 3, torch.randn(4, 32000, generator=generator)]


def histories(length: int, alphabet: int = 4, seed: int = 0) -> torch.Tensor:
    """4 rows of ``length`` tokens drawn from the first ``alphabet`` ids: n-grams repeat, words recur."""
    return torch.randint(0, alphabet, (4, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [1, 2, 3, 5, 12])
def test_no_repeat_ngram_bans_what_transformers_bans(case: int, size: int, length: int) -> None:
    logits = logits_cases()[case]
    for seed in range(3):
        tokens = histories(length, alphabet=3 + seed, seed=seed)
        theirs = NoRepeatNGramLogitsProcessor(size)(tokens, logits.clone())
        ours = no_repeat_ngram(tokens, logits, size)
        assert torch.equal(ours, theirs), (size, length, seed)
    if length >= 5 and size <= 2:  # a history this repetitive always bans something: the comparison has teeth
        assert torch.isinf(theirs).sum() > torch.isinf(logits).sum()


def test_no_repeat_ngram_on_a_hand_made_history() -> None:
    """[1 2 3 1 2]: the 3-gram (1 2 3) was seen, the last two tokens are (1 2): 3 is banned, nothing else; the 2-gram
    rule bans what followed a 2 (3) ; size 1 bans every token seen."""
    tokens = torch.tensor([[1, 2, 3, 1, 2]])
    scores = torch.zeros(1, 6)
    assert torch.isinf(no_repeat_ngram(tokens, scores, 3)).nonzero()[:, 1].tolist() == [3]
    assert torch.isinf(no_repeat_ngram(tokens, scores, 2)).nonzero()[:, 1].tolist() == [3]
    assert torch.isinf(no_repeat_ngram(tokens, scores, 1)).nonzero()[:, 1].tolist() == [1, 2, 3]
    assert not torch.isinf(no_repeat_ngram(tokens, scores, 4)).any()  # (2 3 1 2) never ended in (3 1 2)


BAD_WORDS = [
    [[3]],
    [[1, 2]],
    [[0, 1, 2], [2, 2], [5], [5]],  # a duplicate word
    [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 9]],  # a prefix longer than some histories
    [[9], [2, 3], [3, 0, 1]],  # 9: an eos token (it stays allowed)
]


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("words", range(len(BAD_WORDS)))
@pytest.mark.parametrize("length", [1, 2, 4, 13])
def test_bad_words_are_banned_as_transformers_bans_them(case: int, words: int, length: int) -> None:
    logits = logits_cases()[case]
    eos = [9, 7]
    for seed in range(3):
        tokens = histories(length, alphabet=4, seed=seed)
        theirs = NoBadWordsLogitsProcessor(BAD_WORDS[words], eos)(tokens, logits.clone())
        ours = bad_words_filter(BAD_WORDS[words], eos)(tokens, logits)
        assert torch.equal(ours, theirs), (words, length, seed)


def test_a_bad_word_bans_its_last_token_only_after_its_whole_prefix() -> None:
    """(4 5 6): 6 is banned after ...4 5, not after ...5 alone nor after 4 5 x; a one-token word always."""
    ban = bad_words_filter([[4, 5, 6], [8]], eos=[])
    tokens = torch.tensor([[1, 4, 5], [1, 1, 5], [4, 5, 1], [0, 4, 5]])
    banned = torch.isinf(ban(tokens, torch.zeros(4, 10)))
    assert banned[:, 6].tolist() == [True, False, False, True]
    assert banned[:, 8].all() and banned.sum() == 6


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("seen", [5, 6, 7, 8, 9, 12])
def test_min_new_tokens_and_min_length_forbid_eos_as_transformers(case: int, seen: int) -> None:
    """A prompt of 6 tokens, min_new_tokens=3: eos (two ids, one of them tied with others) forbidden while fewer
    than 3 new tokens are there; min_length=8 likewise on the total."""
    logits = logits_cases()[case]
    tokens = histories(seen)
    for eos in ([2], [2, 4]):
        theirs = MinNewTokensLengthLogitsProcessor(6, 3, eos)(tokens, logits.clone())
        assert torch.equal(forbid_eos(tokens, logits, eos, before=6 + 3), theirs), (seen, eos)
        theirs = MinLengthLogitsProcessor(8, eos)(tokens, logits.clone())
        assert torch.equal(forbid_eos(tokens, logits, eos, before=8), theirs), (seen, eos)
    assert torch.isinf(forbid_eos(tokens, logits, [2], before=9)[:, 2]).all() == (seen < 9)


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_ignores_the_left_padding_as_transformers_generate(case: int, penalty: float) -> None:
    """transformers' generate passes the padding of a padded attention mask as ``prompt_ignore_length``: the pad
    tokens of the padding are not "seen" (a pad id written by the model later is)."""
    logits = logits_cases()[case]
    tokens = histories(7, alphabet=6)
    tokens[:, :3] = 5  # the pad id 5 fills up to 3 leading positions
    tokens[3, 6] = 5  # ... and row 3 generated it
    padding = torch.tensor([0, 1, 3, 3])
    theirs = RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=padding)(tokens, logits.clone())
    assert torch.equal(repetition_penalty(logits, tokens, penalty, padding), theirs)
    plain = RepetitionPenaltyLogitsProcessor(penalty)(tokens, logits.clone())
    assert not torch.equal(plain, theirs) or case == 0  # the padding changes the result


class Shift(LogitsProcessor):
    """A user's processor that does not commute with the built-ins: every score raised by ``by``."""

    def __init__(self, by: float) -> None:
        self.by = by

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores + self.by


class BanToken(LogitsProcessor):
    """A user's processor: one token forbidden."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.index_fill(1, torch.tensor([self.token]), -float("inf"))


def transformers_chain(
    options: GenerateOptions, prompt: int, eos: list[int], user: list[object]
) -> LogitsProcessorList:
    """The processors transformers' ``_get_logits_processor`` builds for ``options``, user's merged, in its order."""
    chain: list[object] = [RepetitionPenaltyLogitsProcessor(options.repetition_penalty or 1.0)]
    chain.append(NoRepeatNGramLogitsProcessor(options.no_repeat_ngram_size or 1))
    chain.append(NoBadWordsLogitsProcessor([list(w) for w in options.bad_words_ids or [[0]]], eos))
    min_length = prompt + options.min_new_tokens if options.min_new_tokens is not None else options.min_length
    chain.append(MinLengthLogitsProcessor(min_length or 0, eos))  # min_new_tokens takes precedence, from the prompt
    chain.append(MinNewTokensLengthLogitsProcessor(prompt, options.min_new_tokens or 0, eos))
    merged = [next((u for u in user if type(u) is type(p)), p) for p in chain]
    return LogitsProcessorList(merged + [u for u in user if u not in merged])


@pytest.mark.parametrize("case", range(3))
def test_the_chain_is_transformers_order_with_the_users_processors_merged(case: int) -> None:
    """Every built-in at once, and a user's list: a processor of a built-in's class takes its place (transformers'
    merge), another one runs after the built-ins, before the sampling warpers."""
    logits = logits_cases()[case]
    options = GenerateOptions(
        repetition_penalty=1.4, no_repeat_ngram_size=2, bad_words_ids=((1, 2), (3,)), min_length=9, min_new_tokens=4
    )
    tokens = histories(9, alphabet=5)  # 9 tokens: min_length=9 would let eos through, 6 + 4 new forbids it
    for user in ([], [BanToken(0), Shift(1.5)], [Shift(-2.0), RepetitionPenaltyLogitsProcessor(3.0), BanToken(4)]):
        ours = score_processors(options, 6, None, (2,), user)(tokens, logits.clone())
        theirs = transformers_chain(options, 6, [2], user)(tokens, logits.clone())
        assert torch.equal(ours, theirs), user
    user_penalty = score_processors(options, 6, None, (2,), [RepetitionPenaltyLogitsProcessor(3.0)])
    assert sum(isinstance(p, RepetitionPenaltyLogitsProcessor) for p in user_penalty.processors) == 1
    assert len(user_penalty.processors) == 5
    shifted_first = LogitsProcessorList([Shift(1.5), *transformers_chain(options, 6, [2], [])])(tokens, logits.clone())
    assert not torch.equal(score_processors(options, 6, None, (2,), [Shift(1.5)])(tokens, logits), shifted_first)


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("seen", [1, 2, 3, 5])
def test_forced_and_suppressed_tokens_as_transformers(case: int, seen: int) -> None:
    """The forced first token (at length 1), the forced eos (at max_length - 1, one id or several), the suppressed
    tokens and those suppressed at the first generated position (after a prompt of 1 token; one more with a forced
    first token), each against transformers' processor, before, at and after the length where it acts."""
    logits = logits_cases()[case]
    tokens = histories(seen)
    cases = [
        (GenerateOptions(forced_bos_token_id=3), ForcedBOSTokenLogitsProcessor(3)),
        (GenerateOptions(forced_eos_token_id=2), ForcedEOSTokenLogitsProcessor(4, 2)),
        (GenerateOptions(forced_eos_token_id=(2, 5)), ForcedEOSTokenLogitsProcessor(4, [2, 5])),
        (GenerateOptions(suppress_tokens=(0, 7)), SuppressTokensLogitsProcessor([0, 7])),
        (GenerateOptions(begin_suppress_tokens=(1, 4)), SuppressTokensAtBeginLogitsProcessor([1, 4], 1)),
    ]
    for options, theirs in cases:
        ours = score_processors(options, 1, None, (), max_length=4)(tokens, logits.clone())
        assert torch.equal(ours, theirs(tokens, logits.clone())), (options, seen)
    both = GenerateOptions(forced_bos_token_id=3, begin_suppress_tokens=(1, 4))
    chain = LogitsProcessorList([ForcedBOSTokenLogitsProcessor(3), SuppressTokensAtBeginLogitsProcessor([1, 4], 2)])
    ours = score_processors(both, 1, None, (), max_length=4)(tokens, logits.clone())
    assert torch.equal(ours, chain(tokens, logits.clone())), seen


def test_the_chooser_records_processed_scores_and_raw_logits() -> None:
    """What ``output_scores``/``output_logits`` return: the scores after every processor and warper (sampling), the
    logits as the step gave them (a processor writing its scores in place does not change them)."""

    class InPlace(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            scores[:, 0] = 100.0
            return scores

    logits = logits_cases()[1]
    chooser = TokenChooser(DecodingOptions(True, 0.5, 3, None, None, 0), InPlace(), record=True)
    assert chooser.choose(logits.clone(), histories(3)).tolist() == [0, 0, 0, 0]
    assert chooser.logits is not None and chooser.scores is not None
    assert torch.equal(chooser.logits[0], logits)
    expected = logits.clone()
    expected[:, 0] = 100.0
    expected = expected / 0.5
    threshold = expected.topk(3).values[:, -1:]
    assert torch.equal(chooser.scores[0], expected.masked_fill(expected < threshold, -float("inf")))


def test_user_criteria_take_a_list_or_one_and_say_whether_they_stop_at_eos() -> None:
    from transformers import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

    assert user_criteria(None) is None and user_criteria([]) is None
    tokens = torch.tensor([[1, 2, 3], [1, 2, 7]])
    criteria = user_criteria(StoppingCriteriaList([EosTokenCriteria(7)]))
    assert criteria is not None and criteria.stop_at_eos and criteria(tokens, None).tolist() == [False, True]
    criteria = user_criteria(MaxLengthCriteria(3))
    assert criteria is not None and not criteria.stop_at_eos and criteria(tokens, None).tolist() == [True, True]
