"""The precision search judges its candidates on every input validation will judge (pipeline.precision.stage.
calibration_feeds): a float16 graph that passed the search on its calibration draws failed validation on a draw the
search never saw. ERNIE 4.5 MoE (the every-type source's small config) is one: it converts in float16 now."""

from __future__ import annotations

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
from model_sources.transformers_all_models import build

import pipeline
from pipeline.exporting.stage import export
from pipeline.precision.stage import calibration_feeds
from pipeline.settings import Settings


def test_calibration_holds_the_sample_its_draws_and_validations_draws() -> None:
    model, sample = torch.nn.Linear(4, 2).eval(), torch.randn(3, 4)
    io = export(model, sample, Settings()).io
    settings = Settings(precision="fp16", calibration_inputs=2, validation_inputs=3)
    feeds = calibration_feeds(io, sample, None, settings)
    assert len(feeds) == 1 + 2 + 3
    ours, validations = feeds[1:3], feeds[3:]  # the calibration draws and validation's: other seeds, other values
    assert not any(
        all((a == b).all() for a, b in zip(f.values(), g.values(), strict=True)) for f in ours for g in validations
    )
    assert len(calibration_feeds(io, sample, None, Settings(precision="fp16", validate=False))) == 1 + 2


def test_ernie_moe_converts_in_float16() -> None:
    model, sample = build("ernie4_5_moe", "Ernie4_5_MoeModel")
    module = pipeline.convert(model, sample, precision="fp16")
    assert module.report.accuracy is not None and module.report.accuracy.passed
