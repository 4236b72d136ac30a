"""Validation that neither lies nor crashes on unusual samples: NaN agreement, empty samples, unknown tolerance keys,
samples that require grad."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import converters
import pipeline
from converters.errors import AccuracyError, InputError


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class ReluNet(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2


def test_nan_on_both_sides_at_the_same_places_is_agreement() -> None:
    sample = torch.tensor([[1.0, -1.0, 2.0, float("nan")]])  # log(-1) and the NaN input: NaN in PyTorch and the graph
    module = pipeline.convert(Log(), sample, backend="onnxruntime")
    assert module.report.accuracy is not None and module.report.accuracy.passed
    out = module(sample)
    assert torch.isnan(out[0, 1]) and torch.isnan(out[0, 3]) and out[0, 2] == pytest.approx(np.log(2.0))


def test_nan_on_one_side_only_is_an_accuracy_error() -> None:
    registry = converters.ConverterRegistry()

    # a wrong converter: Relu as Log gives NaN where PyTorch gives 0 (negative inputs)
    @registry.register("Relu", priority=converters.Priority.HIGH)
    def relu_as_log(ctx: converters.ConverterContext) -> object:
        return ctx.op.Log(ctx.inputs[0])

    one_sided = r"out: max abs .*: \d+ of 64 elements outside .* elements NaN on one side only"
    with pytest.raises(AccuracyError, match=one_sided):
        pipeline.convert(ReluNet(), torch.randn(2, 8), converters=registry, backend="onnxruntime")


def test_empty_sample_is_an_input_error_not_a_pass_on_nothing() -> None:
    with pytest.raises(InputError, match="has no elements") as info:
        pipeline.convert(nn.Linear(4, 3).eval(), torch.randn(0, 4))
    assert "fix:" in str(info.value)


def test_tolerance_for_an_output_that_does_not_exist_is_an_input_error() -> None:
    with pytest.raises(InputError, match="'logits', which is neither an output, a dtype nor a module") as info:
        pipeline.convert(nn.Linear(4, 3).eval(), torch.randn(2, 4), tolerances={"logits": (1e-3, 1e-2)})
    assert "the outputs are: out" in str(info.value)


def test_sample_that_requires_grad_warns_that_outputs_carry_no_gradient() -> None:
    model = nn.Linear(4, 3).eval()
    with pytest.warns(UserWarning, match="require grad"):
        module = pipeline.convert(model, torch.randn(2, 4, requires_grad=True))
    assert module(torch.randn(2, 4, requires_grad=True)).grad_fn is None
