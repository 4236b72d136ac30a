"""Encoder-decoders whose own code stands between them and the step transformers' ``generate`` decodes with.

FSMT's attention (as LED's) masks no position of its self-attention cache over one decoder token: it attends to every
key transformers' growing cache holds. Over the step's static cache it would read the unwritten zeros too, so the step
hands it the written positions only (a view of the static cache, still written in place: the runtime is the same);
the conversion chooses that step because the one over the whole capacity does not give the model's own logits. A
small FSMT then decodes a right-padded batch of two as ``model.generate`` does (greedy, every step's scores, 4 beams).

Pop2Piano's ``generate`` takes ``input_features`` (its ``main_input_name`` says ``input_ids``) and puts a composer's
embedding before them, then calls transformers' loop with ``inputs_embeds``: the encoder graph takes the features and
holds that preparation, computed by the model's own ``generate``.

One conversion per model: FSMT's for TensorRT-RTX when it imports (its real builder builds both graphs, the step's
view of the written positions included; the graphs run on ONNX Runtime beside them), else for ONNX Runtime;
Pop2Piano's for ONNX Runtime. Nothing is downloaded."""

from __future__ import annotations

from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from model_sources.transformers_models import shrunk_config
from tiny_models import converted_for_rtx_when_it_imports, drawn_by_fan_in, greedy_scores
from transformers.generation.utils import GenerationMixin

import pipeline
from pipeline.generation.own_preparation import generate_input_name, own_generate_preparation
from pipeline.generation.seq2seq import Seq2SeqStep, cache_of
from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule

GENERATION = {"max_length": 24, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 8, "do_sample": False, "num_beams": 1}


def fsmt() -> tuple[Any, dict[str, torch.Tensor]]:
    """A small FSMT (an encoder layer, 2 decoder layers, width 32, vocabularies of 128) and a batch of two sources,
    the second 2 tokens shorter (right-padded)."""
    config = shrunk_config(
        "fsmt", {"use_cache": True, "src_vocab_size": 128, "tgt_vocab_size": 128, "encoder_layers": 1}
    )
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.FSMTForConditionalGeneration(config))
    ids = torch.randint(4, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return model, {"input_ids": ids.masked_fill(mask == 0, config.pad_token_id), "attention_mask": mask}


def pop2piano() -> tuple[Any, dict[str, torch.Tensor]]:
    """A small Pop2Piano, the composer tokens its checkpoint's generation config lists, and features of two rows."""
    config = shrunk_config("pop2piano", {"use_cache": True, "num_layers": 1, "num_decoder_layers": 1})
    config.decoder_start_token_id = 0  # the checkpoint's config.json sets it; the config class has no default
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.Pop2PianoForConditionalGeneration(config))
    model.generation_config.composer_to_feature_token = {f"composer{i + 1}": 100 + i for i in range(21)}
    features = torch.randn(2, 6, config.d_model, generator=torch.Generator().manual_seed(1))
    return model, {"input_features": features}


def scores_gap(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference of two steps' scores, where the same tokens are forbidden (-inf) in both."""
    assert torch.equal(actual.isinf(), expected.isinf()) and torch.equal(
        actual[actual.isinf()], expected[expected.isinf()]
    )
    finite = expected.isfinite()
    return float((actual[finite] - expected[finite]).abs().max())


@pytest.fixture(scope="module")
def fsmt_module() -> tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule]:
    model, inputs = fsmt()
    converted = converted_for_rtx_when_it_imports(model, inputs, GENERATION)
    assert isinstance(converted, EncoderDecoderModule)
    return model, inputs, converted


def test_the_step_over_the_whole_static_cache_is_not_the_models_decoding() -> None:
    """What the conversion's choice rests on: over the whole capacity, FSMT's first step attends to the unwritten
    zeros (its logits are not its own); over the written positions they are."""
    model, inputs = fsmt()
    with torch.no_grad():
        expected = model(**inputs, decoder_input_ids=torch.full((2, 1), 2), use_cache=True).logits[:, -1]
        encoder = model.get_encoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        cache = cache_of(model(**inputs, encoder_outputs=encoder, decoder_input_ids=torch.full((2, 1), 2)))
    cross = [t for layer in cache.cross_attention_cache.layers for t in (layer.keys, layer.values)]
    self_shapes = [layer.keys.shape for layer in cache.self_attention_cache.layers]
    past = [torch.zeros(s[0], s[1], 16, s[3]) for s in self_shapes for _ in ("key", "value")]
    logits = {}
    for written_only in (False, True):
        step = Seq2SeqStep(model, len(self_shapes), 32, False, type(encoder), True, written_only).eval()
        with torch.no_grad():
            out = step(torch.full((2, 1), 2), inputs["attention_mask"], torch.tensor(0), *past, *cross)
        logits[written_only] = out["logits"]
    assert float((logits[False] - expected).abs().max()) > 0.1
    assert float((logits[True] - expected).abs().max()) < 1e-4


def test_fsmt_decodes_as_transformers(fsmt_module: tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule]) -> None:
    model, inputs, module = fsmt_module
    expected, expected_scores = greedy_scores(model.generate, inputs, **GREEDY)
    actual, actual_scores = greedy_scores(module.generate, inputs, **GREEDY)
    assert len(set(expected.flatten().tolist())) > 2  # tokens that vary: a decoding that could go wrong
    assert torch.equal(actual, expected)
    assert scores_gap(actual_scores, expected_scores) < 1e-3
    beams = {**GREEDY, "num_beams": 4}
    with torch.no_grad():
        assert torch.equal(module.generate(**inputs, **beams), model.generate(**inputs, **beams))


def test_pop2piano_takes_its_generate_input_and_preparation() -> None:
    model, inputs = pop2piano()
    assert generate_input_name(model) == "input_features"
    assert own_generate_preparation(model) is not None
    bart = transformers.BartForConditionalGeneration(shrunk_config("bart", {"use_cache": True}))
    assert generate_input_name(bart) == "input_ids" and own_generate_preparation(bart) is None
    # ONNX Runtime only (the sweep builds its graphs with TensorRT-RTX): the FSMT test builds the step that is new
    module = pipeline.convert(model, inputs, generation=GENERATION, validate=False)
    assert isinstance(module, EncoderDecoderModule)
    assert [spec.name for spec in module.encoder.io.inputs] == ["input_features"]
    expected, expected_scores = greedy_scores(model.generate, inputs, **GREEDY)
    actual, actual_scores = greedy_scores(module.generate, inputs, **GREEDY)
    assert torch.equal(actual, expected)
    assert scores_gap(actual_scores, expected_scores) < 1e-3
    # the composer's embedding matters: transformers' loop on the bare features decodes otherwise
    with torch.no_grad():
        bare = GenerationMixin.generate(model, inputs_embeds=inputs["input_features"], **GREEDY)
    assert not torch.equal(getattr(bare, "sequences", bare), expected)


class _KeepsItsFeatures(transformers.Pop2PianoForConditionalGeneration):
    """A Pop2Piano whose ``generate`` never reaches transformers' loop: there is nothing to take its inputs from."""

    def generate(self, input_features: torch.Tensor, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return input_features


def test_a_generate_that_never_calls_transformers_loop_is_refused_with_the_fix() -> None:
    model, inputs = pop2piano()
    kept = _KeepsItsFeatures(model.config).eval()
    prepare = own_generate_preparation(kept)
    assert prepare is not None
    with pytest.raises(pipeline.InputError, match="returned without calling transformers' generate") as raised:
        prepare(inputs)
    assert raised.value.fix
