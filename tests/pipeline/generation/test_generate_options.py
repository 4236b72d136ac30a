"""The options of ``generate()``/``stream()`` beyond the sampling ones, each judged end to end against transformers'
own ``model.generate`` on the same tiny Llama (fp32, ONNX Runtime, token-identical greedy): refused options, int32
ids, ``generation_config=``, ``min_new_tokens``, ``no_repeat_ngram_size``, ``bad_words_ids``, a user's
``logits_processor``/``stopping_criteria``, and ``return_dict_in_generate`` with the scores; saved and loaded."""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny_models import left_padded, tiny_llama, tiny_step
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
)

import pipeline
from converters.errors import InputError
from pipeline.runtime.generation.module import GenerativeModule

NEW = 16


@pytest.fixture(scope="module")
def llama() -> transformers.LlamaForCausalLM:
    return tiny_llama(seed=5)


@pytest.fixture(scope="module")
def step(llama: transformers.LlamaForCausalLM) -> GenerativeModule:
    module: GenerativeModule = tiny_step(llama, max_length=40, max_batch=4)
    return module


@pytest.fixture(scope="module")
def loaded(step: GenerativeModule, tmp_path_factory: pytest.TempPathFactory) -> GenerativeModule:
    module = pipeline.load(step.save(tmp_path_factory.mktemp("options") / "llama.ptrt"))
    assert isinstance(module, GenerativeModule)
    return module


def padded() -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of 7, 4 and 6 tokens, left-padded with the pad id 0."""
    return left_padded([7, 4, 6], seed=2)


def theirs(llama: transformers.LlamaForCausalLM, ids: torch.Tensor, mask: torch.Tensor, **options: object) -> object:
    options = {"max_new_tokens": NEW, "do_sample": False, "pad_token_id": 0, "eos_token_id": None, **options}
    return llama.generate(ids, attention_mask=mask, **options)


def ours(step: GenerativeModule, ids: torch.Tensor, mask: torch.Tensor, **options: object) -> object:
    options = {"max_new_tokens": NEW, "pad_token_id": 0, "eos_token_id": [], **options}
    return step.generate(ids, mask, **options)


def test_an_option_not_taken_is_an_input_error_naming_those_taken(step: GenerativeModule) -> None:
    ids = torch.ones(1, 3, dtype=torch.int64)
    with pytest.raises(InputError, match="generate\\(\\) does not take the option typical_p; it takes: ") as info:
        step.generate(ids, typical_p=0.9)
    assert "num_beams" in str(info.value) and "no_repeat_ngram_size" in str(info.value)
    with pytest.raises(InputError, match="does not take the options diversity_penalty, penalty_alpha"):
        step.generate(ids, penalty_alpha=0.6, diversity_penalty=1.0)
    with pytest.raises(InputError, match="stream\\(\\) does not take the option num_beams") as info:
        next(step.stream(ids, num_beams=2))
    assert "call generate() for num_beams" in str(info.value) and "bad_words_ids" in str(info.value)
    with pytest.raises(InputError, match="option return_dict_in_generate"):
        next(step.stream(ids, return_dict_in_generate=True))


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be an int >= 0, got -1"),
        ({"min_new_tokens": 1.5}, "min_new_tokens must be an int >= 0, got 1.5"),
        ({"num_beams": 0}, "num_beams must be a positive int, got 0"),
        ({"bad_words_ids": [3]}, "bad_words_ids must be a non-empty list of non-empty lists"),
        ({"bad_words_ids": [[]]}, "bad_words_ids must be a non-empty list of non-empty lists"),
        ({"bad_words_ids": [[96]]}, "bad_words_ids holds token id(s) [96] outside the model's vocabulary [0, 96)"),
        ({"early_stopping": "sometimes"}, "early_stopping must be True, False or 'never'"),
        ({"num_beams": 2, "do_sample": True}, "beam sampling"),
        ({"num_return_sequences": 2}, "num_return_sequences=2 needs as many beams"),
        ({"num_beams": 2, "streamer": object()}, "a streamer cannot follow beam search"),
        ({"generation_config": {"max_new_tokens": 3}}, "generation_config must be a transformers GenerationConfig"),
    ],
)
def test_a_bad_value_is_an_input_error(step: GenerativeModule, options: dict[str, object], words: str) -> None:
    with pytest.raises(InputError) as info:
        step.generate(torch.ones(1, 3, dtype=torch.int64), max_new_tokens=2, **options)
    assert words in str(info.value) and "fix: " in str(info.value)


def test_int32_ids_decode_as_int64_ones_and_as_transformers(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    ids, mask = padded()
    expected = theirs(llama, ids.to(torch.int32), mask.to(torch.int32))
    got = ours(step, ids.to(torch.int32), mask.to(torch.int32))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
    assert torch.equal(got, expected) and torch.equal(got, ours(step, ids, mask))


def test_generation_config_gives_the_options_and_refuses_fields_not_taken(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    ids, mask = padded()
    config = GenerationConfig(max_new_tokens=10, repetition_penalty=1.3, no_repeat_ngram_size=3, pad_token_id=0)
    expected = llama.generate(ids, attention_mask=mask, generation_config=config, eos_token_id=None)
    assert torch.equal(step.generate(ids, mask, generation_config=config, eos_token_id=[]), expected)
    assert torch.equal(  # keyword arguments win over the config's fields
        step.generate(ids, mask, generation_config=config, eos_token_id=[], max_new_tokens=4), expected[:, :11]
    )
    # the model's own config (bos, use_cache, the flags left off) is taken as it is
    assert step.generate(ids, mask, generation_config=llama.generation_config, max_new_tokens=3).shape == (3, 10)
    with pytest.raises(InputError, match="the generation_config fields num_beam_groups, typical_p") as info:
        step.generate(ids, generation_config=GenerationConfig(typical_p=0.5, num_beam_groups=2))
    assert "set those fields to their defaults" in str(info.value)
    with pytest.raises(InputError, match="stream\\(\\) does not take the generation_config field num_beams"):
        next(step.stream(ids, generation_config=GenerationConfig(num_beams=3)))


def test_min_new_tokens_as_transformers(step: GenerativeModule, llama: transformers.LlamaForCausalLM) -> None:
    """eos is the token row 0 chooses third: without min_new_tokens row 0 stops there, with min_new_tokens=6 it cannot
    (eos forbidden for 6 new tokens); token-identical to transformers either way."""
    ids, mask = padded()
    eos = int(ours(step, ids, mask)[0, 7 + 2])
    for options in ({}, {"min_new_tokens": 6}, {"min_new_tokens": 6, "min_length": 15}):
        expected = theirs(llama, ids, mask, eos_token_id=eos, **options)
        assert torch.equal(ours(step, ids, mask, eos_token_id=eos, **options), expected), options
    assert int(expected[0, 7 + 2]) != eos and (expected[0, 7:13] != eos).all()


def test_no_repeat_ngram_size_as_transformers(step: GenerativeModule, llama: transformers.LlamaForCausalLM) -> None:
    ids, mask = padded()
    plain = ours(step, ids, mask)
    for size in (1, 2, 3):
        expected = theirs(llama, ids, mask, no_repeat_ngram_size=size)
        got = ours(step, ids, mask, no_repeat_ngram_size=size)
        assert torch.equal(got, expected), size
        assert not torch.equal(got, plain)  # the tiny model repeats itself: the ban changes what it says


def test_bad_words_ids_as_transformers(step: GenerativeModule, llama: transformers.LlamaForCausalLM) -> None:
    """Words taken from what the model says: row 0's first new token, and a pair row 1 says later (its prefix must
    be matched at the end of the row to ban the second token)."""
    ids, mask = padded()
    plain = ours(step, ids, mask)
    words = [[int(plain[0, 7])], [int(plain[1, 10]), int(plain[1, 11])], [95]]
    expected = theirs(llama, ids, mask, bad_words_ids=words)
    got = ours(step, ids, mask, bad_words_ids=words)
    assert torch.equal(got, expected)
    assert int(got[0, 7]) != words[0][0] and not torch.equal(got[1], plain[1])


class BanEvenAfter(LogitsProcessor):
    """A user's processor that reads the tokens: after an even token, the even tokens below 40 are forbidden."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        even = (input_ids[:, -1:] % 2 == 0) & (torch.arange(scores.shape[-1]) % 2 == 0) & (torch.arange(96) < 40)
        return scores.masked_fill(even, -float("inf"))


class StopAfter(StoppingCriteria):
    """A user's criterion: a row is done once it holds ``token``."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids: torch.Tensor, scores: object, **kwargs: object) -> torch.Tensor:
        return (input_ids == self.token).any(dim=-1)


def test_a_users_processors_and_criteria_as_transformers_applies_them(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """The user's processors after ours (a RepetitionPenaltyLogitsProcessor of their own replaces the option's), the
    criteria after each token: row 0 stops at its fourth token, the others go on (padded with the pad id)."""
    ids, mask = padded()
    stop = int(ours(step, ids, mask)[0, 7 + 3])
    processors = LogitsProcessorList([BanEvenAfter(), RepetitionPenaltyLogitsProcessor(2.0)])
    criteria = StoppingCriteriaList([StopAfter(stop)])
    for eos in (None, 95):
        options = {"repetition_penalty": 1.2, "logits_processor": processors, "stopping_criteria": criteria}
        expected = theirs(llama, ids, mask, eos_token_id=eos, **options)
        got = ours(step, ids, mask, eos_token_id=[] if eos is None else eos, **options)
        assert torch.equal(got, expected), eos
    plain = ours(step, ids, mask, repetition_penalty=1.2)
    assert not torch.equal(got, plain)


class Recording(StoppingCriteria):
    """A user's criterion that never stops, recording what it is given: the length and the number of scores."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int | None]] = []

    def __call__(self, input_ids: torch.Tensor, scores: object, **kwargs: object) -> torch.Tensor:
        self.calls.append((input_ids.shape[1], None if scores is None else len(scores)))  # type: ignore[arg-type]
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_a_users_criteria_see_what_transformers_gives_them(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """After each token: the rows so far, and the scores so far when output_scores (else None); a user's
    EosTokenCriteria without an eos_token_id option fills the finished rows with the pad id, as transformers."""
    ids, mask = padded()
    for wanted in ({}, {"return_dict_in_generate": True, "output_scores": True}):
        mine, reference = Recording(), Recording()
        ours(step, ids, mask, max_new_tokens=4, stopping_criteria=[mine], **wanted)
        theirs(llama, ids, mask, max_new_tokens=4, stopping_criteria=StoppingCriteriaList([reference]), **wanted)
        assert mine.calls == reference.calls and len(mine.calls) == 4, wanted
    stop = int(ours(step, ids, mask)[1, 7 + 2])
    criteria = StoppingCriteriaList([transformers.EosTokenCriteria(stop)])
    expected = theirs(llama, ids, mask, stopping_criteria=criteria)
    got = ours(step, ids, mask, stopping_criteria=criteria)
    assert torch.equal(got, expected) and (got[1, 7 + 3 :] == 0).all()


def test_return_dict_in_generate_gives_transformers_output_with_its_scores(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """Greedy and seeded sampling: GenerateDecoderOnlyOutput, the sequences transformers gives, every step's
    processed scores (after the warpers when sampling: -inf where they cut) and raw logits, within fp32 noise."""
    from transformers.generation import GenerateDecoderOnlyOutput

    ids, mask = padded()
    wanted = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True}
    for options in ({"repetition_penalty": 1.3}, {"do_sample": True, "top_k": 10, "top_p": 0.8, "temperature": 0.7}):
        torch.manual_seed(3)
        expected = theirs(llama, ids, mask, max_new_tokens=8, **options, **wanted)
        got = ours(step, ids, mask, max_new_tokens=8, seed=3, **options, **wanted)
        assert isinstance(got, GenerateDecoderOnlyOutput) and isinstance(expected, GenerateDecoderOnlyOutput)
        assert torch.equal(got.sequences, expected.sequences)
        assert got.scores is not None and expected.scores is not None and len(got.scores) == len(expected.scores) == 8
        for mine, reference in zip(got.scores, expected.scores, strict=True):
            torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-4)
        for mine, reference in zip(got.logits, expected.logits, strict=True):
            torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-4)
    only = ours(step, ids, mask, max_new_tokens=2, return_dict_in_generate=True)
    assert only.scores is None and only.logits is None and only.sequences.shape == (3, 9)
    assert isinstance(ours(step, ids, mask, max_new_tokens=2, output_scores=True), torch.Tensor)


def test_num_return_sequences_draws_several_per_prompt(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """Each prompt repeated (rows b * n + i), the draws transformers makes under the same seed (top_k given: its
    default of 50 is not ours)."""
    ids, mask = padded()
    got = ours(step, ids[:2], mask[:2], do_sample=True, num_return_sequences=2, seed=1, top_k=30)
    assert got.shape == (4, 7 + NEW) and torch.equal(got[0, :7], got[1, :7]) and torch.equal(got[2, :7], ids[1])
    torch.manual_seed(1)
    assert torch.equal(got, theirs(llama, ids[:2], mask[:2], do_sample=True, num_return_sequences=2, top_k=30))
    assert not torch.equal(got[0], got[1])
    with pytest.raises(InputError, match="3 prompts x 2 sequences per prompt .* = 6 rows.*max_batch=4") as info:
        ours(step, ids, mask, do_sample=True, num_return_sequences=2)
    assert "pass at most 2 prompt(s) per call" in str(info.value)


def test_a_loaded_module_takes_the_same_options(
    step: GenerativeModule, loaded: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    ids, mask = padded()
    options = {"no_repeat_ngram_size": 2, "min_new_tokens": 4, "bad_words_ids": [[3], [5, 6]], "eos_token_id": 95}
    expected = theirs(llama, ids, mask, **options)
    assert torch.equal(ours(loaded, ids, mask, **options), expected)
    assert torch.equal(ours(step, ids, mask, **options), expected)
    with pytest.raises(InputError, match="does not take the option top_a"):
        loaded.generate(ids, top_a=0.2)


def test_return_dict_without_transformers_is_an_input_error(
    step: GenerativeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime imports transformers only for its output classes: without it, the tensor comes back as ever and
    return_dict_in_generate says what is missing."""
    import sys

    monkeypatch.setitem(sys.modules, "transformers.generation", None)  # an import of it fails
    ids = torch.ones(1, 3, dtype=torch.int64)
    assert step.generate(ids, max_new_tokens=2, no_repeat_ngram_size=2).shape == (1, 5)
    with pytest.raises(InputError, match="transformers is not installed"):
        step.generate(ids, max_new_tokens=2, return_dict_in_generate=True)
    with pytest.raises(InputError, match="transformers is not installed"):
        step.generate(ids, max_new_tokens=2, num_beams=2, return_dict_in_generate=True)
