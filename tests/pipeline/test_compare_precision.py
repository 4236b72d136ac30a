"""The comparison and accuracy policy for low precision: fp16 tensors matched per layer by the graph's own types and
judged by float16's magnitude-relative rule, the same in ``convert``, ``compare`` and ``module.compare``; a
transformers BERT converts in fp16 with default settings while a real 1% error in one block fails; a planted error
in one block of an fp16 model is named as the first divergence; in-place residuals give none."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from model_zoo import bert_inputs, hf_resnet_model, tiny_bert_config
from test_compare import make_net, sample, scaled_tanh_registry
from torch import nn

import pipeline
from converters.settings import DEFAULT_TOLERANCES, Tolerance
from pipeline.accuracy.stats import ErrorAccumulator, tolerance_ratio

pytest.importorskip("transformers")

FLOAT16 = DEFAULT_TOLERANCES["float16"]


def bert() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.BertModel(tiny_bert_config(hidden_size=128, intermediate_size=512)).eval()


@pytest.fixture(scope="module")
def fp16_bert() -> tuple[nn.Module, pipeline.ConvertedModule]:
    model = bert()
    return model, pipeline.convert(model, bert_inputs(2, 16, seed=0), backend="onnxruntime", precision="fp16")


# -- the rule itself ---------------------------------------------------------------------------------------------


def test_rounding_noise_passes_and_a_one_percent_error_fails() -> None:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(4096) * 1.0
    reference[:8] = 1e-4  # values near zero beside values near 4: an absolute atol alone would fail them
    noisy = reference + rng.standard_normal(4096) * 5e-4  # float16 rounding at about 1.0 (0.05% of RMS)
    scaled = reference * 1.008  # a real (0.8%) error: every element within rtol, the RMS error is not
    assert tolerance_ratio(noisy, reference, FLOAT16) <= 1.0
    assert tolerance_ratio(scaled, reference, FLOAT16) == pytest.approx(4.0, rel=0.05)
    accumulator = ErrorAccumulator(FLOAT16)
    accumulator.add(scaled, reference)
    stats = accumulator.result()
    assert stats.outside == 0 and stats.rms_failed == 1 and not stats.passed  # the verdict says which rule failed
    assert stats.relative_rms == pytest.approx(0.008, rel=0.01)


def test_a_user_pair_is_the_plain_elementwise_rule() -> None:
    settings = pipeline.Settings(tolerances={"float16": (1e-3, 1e-2)})
    assert settings.tolerances["float16"] == Tolerance(1e-3, 1e-2, 0.0, 0.0)
    assert pipeline.Settings(tolerances={"float16": FLOAT16}).tolerances["float16"] == FLOAT16


# -- BERT in fp16 --------------------------------------------------------------------------------------------------


def test_fp16_bert_converts_with_default_settings(fp16_bert: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    _, module = fp16_bert
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.passed
    hidden = next(o for o in accuracy.outputs if o.name == "last_hidden_state")
    assert hidden.computed_in == "float16" and (hidden.rms_atol, hidden.rms) == (FLOAT16.rms_atol, FLOAT16.rms)
    assert hidden.max_abs > FLOAT16.atol  # the old absolute rule would have failed it ...
    assert hidden.max_abs <= hidden.atol_used and hidden.relative_rms <= FLOAT16.rms  # ... the figures agree
    assert "RMS(x - ref)" in accuracy.rule and "magnitude-relative" in module.report.summary()


def test_a_one_percent_error_in_one_block_of_fp16_bert_fails(
    fp16_bert: tuple[nn.Module, pipeline.ConvertedModule],
) -> None:
    model, _ = fp16_bert
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.encoder.layer[1].output.LayerNorm.weight.mul_(1.01)  # the last block's output, 1% off
    module = pipeline.convert(
        broken, bert_inputs(2, 16, seed=0), backend="onnxruntime", precision="fp16", validate=False
    )
    report = pipeline.compare(model, bert_inputs(2, 16, seed=1), module=module)
    hidden = next(o for o in report.outputs if o.output == "last_hidden_state")
    assert not hidden.passed and hidden.stats.relative_rms == pytest.approx(0.01, rel=0.2)  # type: ignore[union-attr]
    assert "RMS" in report.table()


def test_convert_compare_and_module_compare_judge_alike(fp16_bert: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    model, module = fp16_bert
    by_module = pipeline.compare(model, bert_inputs(2, 16, seed=0), module=module)
    assert by_module.passed
    assert all((o.atol, o.rtol, o.rms) == (FLOAT16.atol, FLOAT16.rtol, FLOAT16.rms) for o in by_module.outputs)
    assert all(o.computed_in == "float16" for o in by_module.outputs)


# -- per layer -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [0.10, 0.01])
def test_planted_error_in_one_block_of_an_fp16_model_is_the_first_divergence(error: float) -> None:
    report = pipeline.compare(
        make_net(), sample(), converters=scaled_tanh_registry(error), per_layer=True, random_inputs=2, precision="fp16"
    )
    assert report.layers is not None and not report.layers.unmatched  # float16 tensors matched too
    divergence = report.first_divergence
    assert divergence is not None and divergence.layer.module == "blocks.3"
    assert all(layer.computed_in == "float16" for layer in report.layers.layers)


def test_fp16_model_without_error_has_no_divergence() -> None:
    report = pipeline.compare(make_net(planted=False), sample(), per_layer=True, random_inputs=1, precision="fp16")
    assert report.passed and report.first_divergence is None
    assert report.layers is not None and not report.layers.unmatched


def test_transformers_resnet_with_in_place_residuals_has_no_divergence() -> None:
    model = hf_resnet_model()
    report = pipeline.compare(model, {"pixel_values": torch.randn(2, 3, 32, 32)}, per_layer=True, random_inputs=1)
    assert report.passed and report.first_divergence is None
    assert report.layers is not None and len(report.layers.layers) > 10
