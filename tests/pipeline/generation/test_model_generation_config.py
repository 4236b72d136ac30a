"""A model's own generation config gives ``generate`` its defaults, as ``model.generate`` applies them: a checkpoint
that samples, penalises repeats, suppresses tokens or forces its last one decodes with those settings unless a call
says otherwise, saved and loaded; validation still judges the step's own greedy choice (its greedy tokens all
identical); a field we do not take is named at conversion; a ``max_length`` beyond the cache becomes the cache's.
One tiny Llama, fp32, ONNX Runtime, a left-padded batch, against transformers' own ``generate``."""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny_models import left_padded, lively, tiny_llama

import pipeline
from converters.errors import InputError
from converters.generation_settings import GenerationSettings
from pipeline.runtime.generation.module import GenerativeModule
from pipeline.runtime.generation.options import generate_options
from pipeline.runtime.generation.request import resolve

CAPACITY = 40
#: What a checkpoint's generation config sets (Llama 2's and Qwen2.5's sample and penalise repeats; BART's force an
#: eos last), beside a field we do not take and a max_length beyond the cache.
CHECKPOINT = {
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.9,
    "repetition_penalty": 1.3,
    "no_repeat_ngram_size": 2,
    "suppress_tokens": [7, 9],
    "forced_eos_token_id": 11,
    "max_length": 4096,
    "typical_p": 0.95,
}


@pytest.fixture(scope="module")
def llama() -> transformers.LlamaForCausalLM:
    model = lively(lambda: tiny_llama(seed=8), seed=8, std=0.15, keep_eos=False)
    for name, value in CHECKPOINT.items():
        setattr(model.generation_config, name, value)
    return model


@pytest.fixture(scope="module")
def converted(llama: transformers.LlamaForCausalLM) -> tuple[GenerativeModule, list[str]]:
    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning) as warned:
        module = pipeline.convert(llama, ids, generation={"max_length": CAPACITY, "max_batch": 4})
    assert isinstance(module, GenerativeModule)
    return module, [str(w.message) for w in warned]


@pytest.fixture(scope="module")
def step(converted: tuple[GenerativeModule, list[str]]) -> GenerativeModule:
    return converted[0]


@pytest.fixture(scope="module")
def loaded(step: GenerativeModule, tmp_path_factory: pytest.TempPathFactory) -> GenerativeModule:
    module = pipeline.load(step.save(tmp_path_factory.mktemp("config") / "llama.ptrt"))
    assert isinstance(module, GenerativeModule)
    return module


GREEDY = {"max_new_tokens": 12, "do_sample": False}


def test_the_models_settings_apply_under_the_calls_and_survive_a_reload(
    step: GenerativeModule, loaded: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """Greedy (asked for), with the checkpoint's penalty, n-gram rule, suppressed and forced tokens: as
    transformers; without them (the model's defaults overridden by the call) the tokens differ."""
    ids, mask = left_padded([7, 4, 6], seed=3)
    with torch.no_grad():
        expected = llama.generate(ids, attention_mask=mask, pad_token_id=0, **GREEDY)
    for module in (step, loaded):
        got = module.generate(ids, mask, pad_token_id=0, **GREEDY)
        assert torch.equal(got, expected)
    assert (expected[:, -1] == 11).all()  # the forced last token
    assert not torch.isin(expected[:, ids.shape[1] :], torch.tensor([7, 9])).any()
    plain = step.generate(
        ids, mask, pad_token_id=0, repetition_penalty=1.0, no_repeat_ngram_size=0, **GREEDY, suppress_tokens=[]
    )
    assert not torch.equal(plain, expected)


def test_a_checkpoint_that_samples_samples_unless_told_otherwise(step: GenerativeModule) -> None:
    ids, mask = left_padded([5, 6], seed=4)
    drawn = {tuple(step.generate(ids, mask, max_new_tokens=10, seed=seed)[0].tolist()) for seed in range(4)}
    assert len(drawn) > 1
    again = step.generate(ids, mask, max_new_tokens=10, seed=2)
    assert torch.equal(again, step.generate(ids, mask, max_new_tokens=10, seed=2))
    greedy = {tuple(step.generate(ids, mask, max_new_tokens=10, do_sample=False, seed=s)[0].tolist()) for s in (0, 1)}
    assert len(greedy) == 1


def test_a_users_generation_config_goes_over_the_models(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    ids, mask = left_padded([6, 3], seed=5)
    theirs = transformers.GenerationConfig(do_sample=False, no_repeat_ngram_size=3, repetition_penalty=1.6)
    with torch.no_grad():
        expected = llama.generate(ids, attention_mask=mask, generation_config=theirs, max_new_tokens=12, pad_token_id=0)
    got = step.generate(ids, mask, generation_config=theirs, max_new_tokens=12, pad_token_id=0)
    assert torch.equal(got, expected)


def test_validation_judged_the_steps_own_greedy_choice(step: GenerativeModule) -> None:
    """The checkpoint's processors do not reach validation's reference: every greedy token identical."""
    decoding = step.report.accuracy.decoding
    assert decoding is not None and decoding.passed
    assert decoding.greedy == decoding.greedy_tokens > 0


def test_a_field_not_taken_is_named_and_a_longer_max_length_is_the_caches(
    converted: tuple[GenerativeModule, list[str]],
) -> None:
    module, warned = converted
    assert any("typical_p=0.95" in message and "does not take" in message for message in warned), warned
    options = dict(module.generation.model_options)
    assert options["max_length"] == CAPACITY and "typical_p" not in options
    ids, mask = left_padded([6], seed=6)
    assert module.generate(ids, mask, do_sample=False).shape[1] == CAPACITY  # no max_new_tokens: the cache's length


def test_top_k_is_fifty_unless_given_and_zero_is_none() -> None:
    """transformers draws among the 50 most likely tokens when no top_k is given; top_k=0 keeps them all."""
    ids, mask = left_padded([3], seed=7)
    settings = GenerationSettings(max_length=CAPACITY, eos_token_id=(95,), pad_token_id=0)

    def top_k(**given: object) -> int | None:
        return resolve(generate_options("generate", given), settings, ids, mask, 96).chooser.options.top_k

    assert top_k(do_sample=True) == 50
    assert top_k(do_sample=True, top_k=0) is None
    assert top_k(do_sample=True, top_k=5) == 5
    with pytest.raises(InputError, match="top_k must be an int >= 0"):
        top_k(do_sample=True, top_k=-1)


def test_a_models_max_new_tokens_within_the_cache_is_kept_over_its_max_length() -> None:
    """transformers reads max_new_tokens first: a checkpoint's 10 new tokens stay beside a max_length of 8192 (which
    is not read); 100 new tokens, beyond the cache, become the cache's length."""
    from pipeline.runtime.generation.options import model_defaults

    kept = model_defaults(transformers.GenerationConfig(max_new_tokens=10, max_length=8192), CAPACITY)[0]
    assert kept == {"max_new_tokens": 10}
    capped = model_defaults(transformers.GenerationConfig(max_new_tokens=100), CAPACITY)[0]
    assert capped == {"max_length": CAPACITY}


def test_beam_sampling_from_the_models_settings_says_where_it_comes_from() -> None:
    """A checkpoint's beams meeting a call's do_sample=True (transformers would sample beams, which we do not take):
    an InputError naming the model's setting; num_beams=1 in the call turns the model's beams off."""
    beams = (("num_beams", 4),)
    with pytest.raises(InputError, match="num_beams=4 from the model's generation config"):
        generate_options("generate", {"do_sample": True}, beams)
    assert generate_options("generate", {"do_sample": True, "num_beams": 1}, beams).num_beams == 1
    assert generate_options("generate", {}, beams).num_beams == 4


def test_a_transformers_older_than_generation_needs_is_refused_naming_it(
    llama: transformers.LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """generation= reads transformers 5's caches and generation-config semantics: an older one (here: the floor
    raised above the installed version) is an InputError naming the installed version and the install."""
    import pipeline.generation

    monkeypatch.setattr(pipeline.generation, "MIN_TRANSFORMERS", int(transformers.__version__.split(".")[0]) + 1)
    with pytest.raises(InputError, match=rf"transformers {transformers.__version__} is installed") as refused:
        pipeline.convert(llama, torch.tensor([[3, 4, 5]]), generation={"max_length": CAPACITY})
    assert "pip install 'transformers>=" in str(refused.value)
