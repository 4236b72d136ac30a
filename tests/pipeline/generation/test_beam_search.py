"""Beam search (``generate(num_beams=...)``) judged against transformers' ``model.generate(num_beams=...,
do_sample=False)`` on the same tiny Llama: token-identical sequences and beam indices, the same ``sequences_scores``
and per-step scores within fp32 noise, over length penalties, every ``early_stopping`` and ``num_return_sequences``;
the cache reordered by each runner (``reorder``); the limits; a saved and loaded module."""

from __future__ import annotations

import itertools

import pytest
import torch
import transformers
from tiny_models import left_padded, tiny_llama, tiny_step

import pipeline
from converters.errors import InputError
from pipeline.runtime.generation.layout import cache_layout
from pipeline.runtime.generation.module import GenerativeModule
from pipeline.runtime.generation.runners import CopyingRunner, OrtBoundRunner, step_runner


@pytest.fixture(scope="module")
def llama() -> transformers.LlamaForCausalLM:
    return tiny_llama(seed=7)


@pytest.fixture(scope="module")
def step(llama: transformers.LlamaForCausalLM) -> GenerativeModule:
    module: GenerativeModule = tiny_step(llama, max_length=32, max_batch=6)
    return module


def padded() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 6 and 4 tokens, left-padded with the pad id 0."""
    return left_padded([6, 4], seed=4)


def beam_eos(step: GenerativeModule) -> int:
    """A token the beams of the padded prompts reach within a few steps (so that beams finish early and the finished
    set, the length penalty and early stopping all matter)."""
    ids, mask = padded()
    out = step.generate(ids, mask, num_beams=3, max_new_tokens=6, eos_token_id=[], pad_token_id=0)
    return int(out[0, 6 + 2])


def compare(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM, max_new_tokens: int = 12, **options: object
) -> object:
    """Our output against transformers' for the padded prompts; returns ours."""
    ids, mask = padded()
    options = {"pad_token_id": 0, "return_dict_in_generate": True, "output_scores": True, **options}
    theirs = llama.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, **options)
    eos = options.pop("eos_token_id", None)
    ours = step.generate(ids, mask, max_new_tokens=max_new_tokens, eos_token_id=[] if eos is None else eos, **options)
    assert type(ours).__name__ == "GenerateBeamDecoderOnlyOutput" == type(theirs).__name__
    assert torch.equal(ours.sequences, theirs.sequences), (options, ours.sequences, theirs.sequences)
    assert torch.equal(ours.beam_indices, theirs.beam_indices)
    torch.testing.assert_close(ours.sequences_scores, theirs.sequences_scores, rtol=1e-4, atol=1e-4)
    assert len(ours.scores) == len(theirs.scores)
    for mine, reference in zip(ours.scores, theirs.scores, strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-4)
    return ours


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0, -1.5])
def test_beams_score_and_order_as_transformers(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM, length_penalty: float
) -> None:
    """Three beams over two padded prompts, an eos the beams reach early, every sequence returned."""
    eos = beam_eos(step)
    ours = compare(step, llama, num_beams=3, num_return_sequences=3, eos_token_id=eos, length_penalty=length_penalty)
    assert ours.sequences.shape[0] == 6
    if length_penalty <= 0:  # no reward for length: a sequence that ended early is among those returned
        assert (ours.sequences[:, 6:] == eos).any()


def test_early_stopping_as_transformers(step: GenerativeModule, llama: transformers.LlamaForCausalLM) -> None:
    """True (stop once num_beams sequences are done), False (once no running beam could beat the worst finished at
    its current length) and "never" (... at the longest length): an eos among the beams' tokens for which
    transformers' three results differ pairwise (so that each rule is seen), then each compared."""
    ids, mask = padded()
    beams = step.generate(ids, mask, num_beams=3, max_new_tokens=6, eos_token_id=[], pad_token_id=0)
    options = {"num_beams": 3, "num_return_sequences": 3, "max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    for eos in dict.fromkeys(beams[:, 6:].flatten().tolist()):
        results = [
            llama.generate(ids, attention_mask=mask, eos_token_id=eos, early_stopping=rule, **options)
            for rule in (True, False, "never")
        ]
        if all(a.shape != b.shape or not torch.equal(a, b) for a, b in itertools.combinations(results, 2)):
            break
    else:
        pytest.fail("no eos token separates the three early_stopping rules on these prompts")
    for rule in (True, False, "never"):
        compare(step, llama, num_beams=3, num_return_sequences=3, eos_token_id=eos, early_stopping=rule)


def test_beams_without_eos_and_with_the_other_options(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """No eos (every beam runs to the length limit); then the processors on the log-probabilities: repetition
    penalty, no-repeat n-grams, bad words and min_new_tokens, as transformers applies them in beam search."""
    plain = compare(step, llama, num_beams=3)
    assert plain.sequences.shape == (2, 6 + 12)
    eos = beam_eos(step)
    options = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "bad_words_ids": [[5], [7, 8]]}
    compare(step, llama, num_beams=3, num_return_sequences=2, eos_token_id=eos, min_new_tokens=4, **options)


def test_plain_beam_output_and_the_limits(step: GenerativeModule, llama: transformers.LlamaForCausalLM) -> None:
    """Without return_dict_in_generate the sequences come back as a tensor; rows = prompts x beams must fit
    max_batch; stream() refuses beams (only generate orders them)."""
    ids, mask = padded()
    expected = llama.generate(ids, attention_mask=mask, num_beams=3, do_sample=False, max_new_tokens=5, pad_token_id=0)
    got = step.generate(ids, mask, num_beams=3, max_new_tokens=5, pad_token_id=0)
    assert isinstance(got, torch.Tensor) and torch.equal(got, expected)
    with pytest.raises(InputError, match="2 prompts x 4 beams = 8 rows, but the step was converted for max_batch=6"):
        step.generate(ids, mask, num_beams=4)
    with pytest.raises(InputError, match="stream\\(\\) does not take the option num_beams"):
        next(step.stream(ids, mask, num_beams=2))
    with pytest.raises(InputError, match="num_return_sequences=4 needs as many beams"):
        step.generate(ids, mask, num_beams=3, num_return_sequences=4)


def test_a_loaded_module_searches_the_same(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM, tmp_path: object
) -> None:
    loaded = pipeline.load(step.save(tmp_path / "beams.ptrt"))  # type: ignore[operator]
    assert isinstance(loaded, GenerativeModule)
    eos = beam_eos(step)
    compare(loaded, llama, num_beams=3, num_return_sequences=2, eos_token_id=eos, length_penalty=0.5)


@pytest.mark.parametrize("kind", ["copying", "bound", "bound-two-sets"])
def test_each_runner_reorders_its_cache_rows(step: GenerativeModule, kind: str) -> None:
    """Three different prompts prefilled, the rows reordered [2, 0, 0], then one step: the logits are those of the
    prompts in that order prefilled afresh (the cache rows moved with their prompts; for the bound runner's two
    buffer sets, both)."""
    layout = cache_layout(step.io, step.generation.layers)

    def runner() -> CopyingRunner | OrtBoundRunner:
        if kind == "copying":
            return CopyingRunner(step._executor, layout)
        made = step_runner(step._executor, layout, aliased=kind == "bound")
        assert isinstance(made, OrtBoundRunner)
        return made

    ids = torch.randint(1, 90, (3, 5), generator=torch.Generator().manual_seed(8))
    capacity = step.generation.max_length
    mask = torch.zeros(3, capacity, dtype=torch.int64)
    mask[:, :6] = 1
    positions = torch.arange(5).expand(3, 5)
    next_token, next_position = torch.tensor([[11], [12], [13]]), torch.full((3, 1), 5)

    moved = runner()
    moved.start(3)
    moved.run(ids, mask, positions, 0)
    moved.run(ids[:, :1] * 0 + 3, mask, torch.full((3, 1), 5), 5)  # a step, so that the two sets swap once
    moved.reorder(torch.tensor([2, 0, 0]))
    got = moved.run(next_token, mask | (torch.arange(capacity) < 7), next_position + 1, 6)

    fresh = runner()
    fresh.start(3)
    order = torch.tensor([2, 0, 0])
    fresh.run(ids[order], mask, positions, 0)
    fresh.run(ids[:, :1] * 0 + 3, mask, torch.full((3, 1), 5), 5)
    expected = fresh.run(next_token, mask | (torch.arange(capacity) < 7), next_position + 1, 6)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not torch.equal(got[0], got[1])  # the rows differ: a reorder that did nothing would show


def test_the_tensorrt_runner_reorders_its_device_buffers_in_place_in_the_engines_turn(step: GenerativeModule) -> None:
    """TrtCacheRunner cannot run here (no GPU): with a stand-in engine runner on the CPU, its reorder moves the rows
    of every cache buffer in place (the addresses the engine is bound to stay) inside the engine's exclusive turn."""
    import contextlib

    from pipeline.runtime.generation.trt_cache import TrtCacheRunner

    class Engine:
        device = torch.device("cpu")
        turns = 0

        @contextlib.contextmanager
        def exclusive(self) -> object:
            Engine.turns += 1
            yield None

    runner = TrtCacheRunner(Engine(), cache_layout(step.io, step.generation.layers))
    runner.start(3)
    for buffer in runner.cache:
        buffer.copy_(torch.arange(3, dtype=buffer.dtype).view(3, *[1] * (buffer.dim() - 1)).expand_as(buffer))
    addresses = [buffer.data_ptr() for buffer in runner.cache]
    runner.reorder(torch.tensor([2, 2, 0]))
    assert [buffer.data_ptr() for buffer in runner.cache] == addresses and Engine.turns == 1
    for buffer in runner.cache:
        assert buffer[:, 0, 0, 0].tolist() == [2, 2, 0] and bool((buffer[1] == 2).all())
