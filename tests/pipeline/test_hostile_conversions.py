"""Hostile conversions (issue 36): inputs a careful user would expect to be refused, or warned about loudly, and that
were once accepted in silence. Each test says what the user expects, then checks the exception class, that the
message names the cause, and that it gives the fix.

Models are real and tiny: nn.Linear stacks for refit and quantization, a two-layer Llama with random weights for
generation (most errors are raised before anything is exported).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tiny_models
import torch
import transformers
from torch import nn

import pipeline
from converters.errors import AccuracyError, InputError
from converters.settings import Settings
from pipeline.accuracy.stats import ALL_NAN_NOTE, ErrorAccumulator
from pipeline.settings import Tolerance

SAMPLE = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()


def tiny_llama(vocab: int = 128) -> transformers.LlamaForCausalLM:
    return tiny_models.tiny_llama(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, max_position_embeddings=64, eos_token_id=2
    )


def prompt(rows: int, tokens: int) -> torch.Tensor:
    return torch.randint(3, 100, (rows, tokens), generator=torch.Generator().manual_seed(1))


def assert_says(error: pytest.ExceptionInfo[Exception], *words: str) -> None:
    text = str(error.value)
    assert "fix:" in text, text
    for word in words:
        assert word in text, (word, text)


# 1. refit with non-finite weights


def test_refit_refuses_nan_and_inf_weights_before_rebuilding_naming_the_tensors() -> None:
    """A careful user refitting a diverged checkpoint expects a refusal naming the NaN/inf parameters and how many
    values are not finite, not a module whose every output is NaN with a report saying accuracy passed; and the
    module keeps its weights."""
    model = mlp(0)  # kept alive: a state dict is loaded into a copy of it
    module = pipeline.convert(model, SAMPLE, backend="onnxruntime", validation_inputs=0)
    before = module(SAMPLE).detach().clone()
    diverged = mlp(1)
    with torch.no_grad():
        diverged[0].weight[0, :3] = float("nan")
        diverged[2].bias[1] = float("inf")
    with pytest.raises(InputError) as error:
        pipeline.refit(module, diverged)
    assert_says(error, "4 non-finite", "0.weight (3 of 512)", "2.bias (1 of 8)", "checkpoint")
    with pytest.raises(InputError, match=r"0\.weight \(3 of 512\)"):  # a state dict is checked as well
        pipeline.refit(module, diverged.state_dict())
    assert torch.equal(module(SAMPLE), before)
    assert [name for name, _ in module.report.stages][-1] != "refit"  # nothing was rebuilt


def test_an_output_nan_everywhere_on_both_sides_never_passes_validation() -> None:
    """NaN compares equal to NaN at the same places, so a model whose weights are NaN once 'passed' validation with
    every output NaN. A careful user expects a failure saying nothing was compared, and what to check."""
    model = mlp(0)
    with torch.no_grad():
        model[2].weight.fill_(float("nan"))
    with pytest.raises(AccuracyError) as error:
        pipeline.convert(model, SAMPLE, backend="onnxruntime", validation_inputs=1)
    assert_says(error, ALL_NAN_NOTE, "NaN or inf")
    accumulator = ErrorAccumulator(Tolerance(1e-5, 1e-4))
    accumulator.add(np.full(4, np.nan), np.full(4, np.nan))
    stats = accumulator.result()
    assert stats.all_nan and not stats.passed and stats.outside == 4  # the figures agree with the verdict
    partial = ErrorAccumulator(Tolerance(1e-5, 1e-4))
    partial.add(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    assert partial.result().passed  # NaN at the same places beside compared values still agrees


# 2. generation settings against the sample and the vocabulary


@pytest.mark.parametrize(
    ("shape", "generation", "words"),
    [
        ((1, 6), {"max_length": 4, "max_batch": 1}, ["6 tokens", "max_length=4", "'max_length': 14"]),
        ((1, 6), {"max_length": 12, "max_batch": 1}, ["6 tokens plus the 8 decode step(s)", "validation_steps=6"]),
        ((3, 4), {"max_length": 32, "max_batch": 2}, ["3 rows", "max_batch=2", "'max_batch': 3"]),
    ],
)
def test_a_generation_sample_that_does_not_fit_is_refused_not_cut(
    shape: tuple[int, int], generation: dict[str, int], words: list[str]
) -> None:
    """A careful user expects the sample they gave to be the prompt validation decodes: a sample longer than the
    cache leaves room for (its tokens plus the judged decode steps), or with more rows than max_batch, is an
    InputError with the sizes and the fix, not a silently cut sample."""
    with pytest.raises(InputError) as error:
        pipeline.convert(tiny_llama(), prompt(*shape), generation=generation)
    assert_says(error, "sample does not fit", *words)


def test_a_sample_that_fits_only_without_validation_converts_with_validate_false() -> None:
    """Without validation nothing is decoded at conversion: a prompt needs room for one new token only."""
    ids = prompt(1, 6)
    with pytest.raises(InputError, match="plus one new token"):
        pipeline.convert(tiny_llama(), ids, generation={"max_length": 6, "max_batch": 1}, validate=False)
    module = pipeline.convert(tiny_llama(), ids, generation={"max_length": 8, "max_batch": 1}, validate=False)
    assert module.generation.max_length == 8


@pytest.mark.parametrize(
    ("generation", "words"),
    [
        ({"eos_token_id": "12"}, ["eos_token_id must be an int or a sequence of ints", "'12' (str)"]),
        ({"eos_token_id": True}, ["True (bool)"]),
        ({"eos_token_id": [2, 7.0]}, ["[2, 7.0] (list)"]),
        ({"eos_token_id": -1}, ["[-1]", ">= 0"]),
        ({"pad_token_id": "0"}, ["pad_token_id must be an int", "'0' (str)"]),
        ({"pad_token_id": [0]}, ["pad_token_id must be an int", "[0] (list)"]),
    ],
)
def test_token_ids_must_be_ints(generation: dict[str, object], words: list[str]) -> None:
    """eos_token_id="12" once became (1, 2), a string iterated. A careful user expects an int (or a sequence of ints
    for eos) and anything else refused with its value and type, before the model is touched."""
    with pytest.raises(InputError) as error:
        pipeline.convert(tiny_llama(), prompt(1, 4), generation={"max_length": 16, "max_batch": 1, **generation})
    assert_says(error, *words)
    assert Settings(generation={"eos_token_id": [2, np.int64(7)]}).generation.eos_token_id == (2, 7)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("generation", "words"),
    [
        ({"eos_token_id": 5000}, ["eos_token_id=5000", "[0, 128)"]),
        ({"eos_token_id": [2, 128], "pad_token_id": 300}, ["eos_token_id=128", "pad_token_id=300"]),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused(generation: dict[str, object], words: list[str]) -> None:
    """A careful user expects an eos the model can never produce (or a pad it cannot embed) to be refused once the
    vocabulary is known (the width of the model's logits), not a module that never stops."""
    with pytest.raises(InputError) as error:
        pipeline.convert(tiny_llama(), prompt(1, 4), generation={"max_length": 16, "max_batch": 1, **generation})
    assert_says(error, "outside the model's vocabulary", "tokenizer", *words)


def test_a_token_id_from_the_models_generation_config_outside_the_vocabulary_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A shrunk test config keeps its tokenizer's eos (GPT-2's 50256 over a vocabulary of 128): transformers' generate
    just never meets it. A careful user expects the conversion to go on, to be told, and the id not to be kept."""
    model = tiny_llama()
    model.generation_config.eos_token_id = [999, 3]
    with caplog.at_level("WARNING"):
        module = pipeline.convert(model, prompt(1, 4), generation={"max_length": 16, "max_batch": 1}, validate=False)
    assert module.generation.eos_token_id == (3,)
    assert "eos_token_id=999 from the model's generation_config outside its vocabulary [0, 128)" in caplog.text


# 3. AWQ calibration


def awq_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 16)).eval()


AWQ = {"precision": "int4", "block_size": 32, "calibration_method": "awq", "quantize_fallback": "fp32"}


def test_calibration_of_the_wrong_shape_names_the_input_and_both_shapes() -> None:
    """Calibration samples 32 wide for a model taking 64 once surfaced as Polygraphy's 'Cannot reuse input data'. A
    careful user expects an InputError naming the input, the shape the graph takes and the shape given."""
    with pytest.raises(InputError) as error:
        pipeline.convert(awq_model(), torch.randn(4, 64), calibration=[torch.randn(4, 64), torch.randn(4, 32)], **AWQ)
    assert_says(error, "calibration sample 1", "'input'", "[4, 32]", "[4, 64]", "dynamic")


def test_calibration_may_differ_along_a_dynamic_dimension() -> None:
    module = pipeline.convert(
        awq_model(), torch.randn(4, 64), calibration=[torch.randn(7, 64)], validate=False,
        dynamic={"input": {0: ("batch", 1, 4, 8)}}, **AWQ,
    )  # fmt: skip
    assert module.report.quantization is not None and module.report.quantization.method == "awq"


def test_awq_without_calibration_warns_that_its_scales_were_fitted_on_random_inputs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """AWQ weighs channels by their activations: a careful user expects a loud warning (in the log and the report)
    when no calibration= was given and the scales were fitted on drawn inputs."""
    with caplog.at_level(logging.WARNING, logger="pipeline.quantize.stage"):
        module = pipeline.convert(awq_model(), torch.randn(4, 64), validate=False, **AWQ)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "awq" in r.getMessage()]
    assert len(logged) == 1 and "random inputs" in logged[0] and "fix: pass calibration=" in logged[0]
    assert module.report.quantization is not None and logged[0] in module.report.quantization.warnings
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.quantize.stage"):
        pipeline.convert(awq_model(), torch.randn(4, 64), calibration=[torch.randn(4, 64)], validate=False, **AWQ)
    assert not any("random inputs" in r.getMessage() for r in caplog.records)


# 4. NVFP4's block size


def test_nvfp4_refuses_a_block_size_other_than_16_and_the_settings_say_16() -> None:
    """NVFP4's blocks are 16 values by the format: block_size=64 was silently ignored while module.settings said 64.
    A careful user expects an InputError, and settings that claim only the block size used."""
    with pytest.raises(InputError) as error:
        Settings(precision="nvfp4", block_size=64)
    assert_says(error, "blocks of 16", "fixed by the format", "block_size=64", "drop block_size")
    assert Settings(precision="nvfp4").block_size == 16
    assert Settings(precision="nvfp4", block_size=16).block_size == 16
    assert Settings(precision="int4").block_size == 128 and Settings(precision="int4", block_size=32).block_size == 32
    with pytest.raises(InputError, match="fixed by the format"):
        pipeline.convert(awq_model(), torch.randn(4, 64), precision="nvfp4", block_size=64)
