"""Drawn validation inputs PyTorch itself refuses are dropped loudly (a WARNING, the report's ``dropped``, the
summary) and validation goes on with the others; the sample refused stays an InputError; never a pass on nothing."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from refusing_models import TARGET, LowerCholesky, ShiftedCrossEntropy, X

import pipeline
from converters.errors import InputError
from converters.settings import Settings
from pipeline.runtime.reports.conversion import ConversionReport
from pipeline.validation.stage import validate


def test_refused_draws_are_dropped_loudly_and_the_rest_validated(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        module = pipeline.convert(
            ShiftedCrossEntropy().eval(), (X, TARGET), backend="onnxruntime", validation_inputs=6, seed=2
        )
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.passed
    assert [d.index for d in accuracy.dropped] == [1, 4, 6] and accuracy.inputs == 4  # 7 inputs, 3 dropped
    assert all(d.function == "binary_cross_entropy" and "between 0 and 1" in d.reason for d in accuracy.dropped)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "dropped" in r.getMessage()]
    assert len(warnings) == 3 and "'binary_cross_entropy'" in warnings[0].getMessage()
    summary = module.report.summary()
    assert "accuracy  PASS on 4 inputs" in summary and "3 drawn input(s) dropped" in summary
    again = ConversionReport.from_dict(module.report.to_dict())  # the artifact's metadata keeps them
    assert again.accuracy is not None and again.accuracy.dropped == accuracy.dropped


def test_a_refusal_outside_python_names_the_aten_op_and_the_sample_alone_is_validated() -> None:
    a = torch.tensor([[4.0, 9.0, -3.0], [1.0, 5.0, 7.0], [0.5, 1.0, 6.0]])  # lower triangle: positive definite
    module = pipeline.convert(LowerCholesky().eval(), a, backend="onnxruntime", validation_inputs=2)
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.passed and accuracy.inputs == 1
    assert [d.index for d in accuracy.dropped] == [1, 2]
    assert all(d.function.startswith("aten.") and "positive-definite" in d.reason for d in accuracy.dropped)
    assert "in ATen op 'aten." in accuracy.dropped[0].summary()


def test_the_users_input_refused_is_an_input_error_not_dropped() -> None:
    model = ShiftedCrossEntropy().eval()
    module = pipeline.convert(model, (X, TARGET), backend="onnxruntime", validate=False)
    runner = OnnxrtRunner(SessionFromOnnx(module.onnx.SerializeToString()))
    refused = {"x": np.array([3.0, 0.0, 0.0, 0.0], np.float32), "target": TARGET.numpy()}
    taken = {"x": X.numpy(), "target": TARGET.numpy()}
    with pytest.raises(InputError, match="PyTorch itself raised in torch function 'binary_cross_entropy'") as info:
        validate(model, module.io, runner, [refused, taken], Settings(), graph=module.onnx, given=1)
    assert "on the sample you gave" in str(info.value) and "drawn" not in str(info.value)
    assert "fix:" in str(info.value)
    with pytest.raises(InputError, match="refused every one of the 2 validation inputs") as info:
        # nothing the user gave, nothing PyTorch takes: an error, never a pass on zero inputs
        validate(model, module.io, runner, [refused, refused], Settings(), graph=module.onnx, given=0)
    assert "input 0 dropped" in str(info.value)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_refused_calibration_draws_are_dropped_loudly_and_the_conversion_goes_on(
    precision: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The precision and quantize stages calibrate on inputs drawn like the sample: one PyTorch refuses is dropped
    with a WARNING, as in validation, instead of failing the conversion that fp32 passes."""
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        module = pipeline.convert(
            ShiftedCrossEntropy().eval(), (X, TARGET), backend="onnxruntime", precision=precision, calibration_inputs=4
        )
    assert module.report.accuracy is not None and module.report.accuracy.passed
    dropped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("calibration input")]
    assert dropped and all("'binary_cross_entropy'" in m and "calibration=" in m for m in dropped)
    assert len(dropped) == len(set(dropped))  # once each, also where INT8's fp16 part is calibrated on the same


def test_a_calibration_input_the_user_gave_and_pytorch_refuses_is_an_input_error() -> None:
    refused = (torch.tensor([3.0, 0.0, 0.0, 0.0]), TARGET)
    with pytest.raises(InputError, match="on input 1 of those you gave") as info:
        pipeline.convert(
            ShiftedCrossEntropy().eval(), (X, TARGET), backend="onnxruntime", precision="fp16",
            calibration=[(X, TARGET), refused],
        )  # fmt: skip
    assert "fix:" in str(info.value)
