"""Validation that is right on OpInfo's corners: 0-d outputs, NaN and infinities at the same places, random ops
judged by distribution, float64 outputs judged as the float32 the graph computes in; and a report whose figures
agree with its verdict."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import converters
import pipeline
from converters.errors import AccuracyError
from pipeline.runtime.reports.accuracy import AccuracyReport


class Add(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Noise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn_like(x)


class Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.double() * 3.0).sin()


class Ratio(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x) / y  # NaN below 0, +-inf where y is 0


def _accuracy(module: pipeline.ConvertedModule) -> AccuracyReport:
    accuracy = module.report.accuracy
    assert accuracy is not None
    for output in accuracy.outputs:  # the figures agree with the verdict
        assert output.passed == (output.outside == 0)
    return accuracy


def test_zero_dimensional_output_is_compared_not_a_crash() -> None:
    x, y = torch.tensor(1.5), torch.tensor(-0.25)
    module = pipeline.convert(Add().eval(), (x, y), backend="onnxruntime")
    (out,) = _accuracy(module).outputs
    assert out.passed and out.elements == 4 and out.max_abs == 0.0  # the sample and 3 random inputs, one value each
    assert module(x, y).shape == () and float(module(x, y)) == pytest.approx(1.25)


def _wrong_converter(op: str, instead: str) -> converters.ConverterRegistry:
    """A registry whose converter for the two-input ONNX ``op`` emits ``instead``: a wrong converter."""
    registry = converters.ConverterRegistry()

    @registry.register(op, priority=converters.Priority.HIGH)
    def wrong(ctx: converters.ConverterContext) -> object:
        return getattr(ctx.op, instead)(ctx.inputs[0], ctx.inputs[1])

    return registry


def test_zero_dimensional_output_that_differs_fails_with_its_figures() -> None:
    registry = _wrong_converter("Add", "Sub")
    with pytest.raises(AccuracyError, match=r"out: max abs .*: 4 of 4 elements outside") as info:
        pipeline.convert(Add().eval(), (torch.tensor(1.5), torch.tensor(-0.25)), converters=registry)
    assert "fix:" in str(info.value)


def test_nan_and_infinities_at_the_same_places_agree() -> None:
    x = torch.tensor([4.0, -1.0, 9.0, 0.0, 1.0])
    y = torch.tensor([2.0, 1.0, 0.0, 0.0, -0.0])  # 2, NaN, +inf, NaN (0/0), -inf
    module = pipeline.convert(Ratio().eval(), (x, y), backend="onnxruntime", validation_inputs=0)
    (out,) = _accuracy(module).outputs
    assert out.passed and out.max_abs == 0.0 and out.elements == 5
    got = module(x, y)
    assert math.isnan(got[1]) and got[2] == math.inf and got[4] == -math.inf


def test_infinity_against_a_finite_value_fails() -> None:
    registry = converters.ConverterRegistry()

    @registry.register("Div", priority=converters.Priority.HIGH)
    def div_as_mul(ctx: converters.ConverterContext) -> object:  # a wrong converter: x * y for x / y
        return ctx.op.Mul(ctx.inputs[0], ctx.inputs[1])

    x, y = torch.tensor([4.0, 9.0]), torch.tensor([2.0, 0.0])
    with pytest.raises(AccuracyError, match=r"out: max abs inf .*: 2 of 2 elements outside"):
        pipeline.convert(Ratio().eval(), (x, y), converters=registry, validation_inputs=0)


def test_random_output_is_judged_by_distribution_with_the_reason() -> None:
    module = pipeline.convert(Noise().eval(), torch.zeros(64, 32), backend="onnxruntime")
    (out,) = _accuracy(module).outputs
    assert out.passed and out.elements == 4 * 64 * 32
    assert out.note.startswith("random (depends on RandomNormalLike")
    assert "judged by distribution" in out.note and "KS distance" in out.note
    assert math.isnan(out.max_abs)  # not compared value by value: no element figures to misread
    assert "Kolmogorov-Smirnov" in _accuracy(module).rule


def test_random_output_from_the_wrong_distribution_fails() -> None:
    registry = converters.ConverterRegistry()

    @registry.register("RandomNormalLike", priority=converters.Priority.HIGH)
    def uniform_for_normal(ctx: converters.ConverterContext) -> object:  # uniform [0, 1) where N(0, 1) is meant
        return ctx.op.RandomUniformLike(ctx.inputs[0])

    with pytest.raises(AccuracyError, match=r"out: FAIL, random .* KS distance [0-9.]+ > bound") as info:
        pipeline.convert(Noise().eval(), torch.zeros(64, 32), converters=registry, backend="onnxruntime")
    assert "mean" in str(info.value) and "std" in str(info.value)


def test_float64_output_is_judged_as_the_float32_the_graph_computes_in() -> None:
    module = pipeline.convert(Double().eval(), torch.randn(4, 5), backend="onnxruntime")
    (out,) = _accuracy(module).outputs
    assert out.dtype == "float64" and out.computed_in == "float32"
    assert (out.atol, out.rtol) == (1e-5, 1e-4)
    assert "TensorRT computes it in float32" in out.note
    assert "TensorRT computes it in float32" in module.report.summary()


def test_float64_tolerance_given_by_name_wins() -> None:
    module = pipeline.convert(
        Double().eval(), torch.randn(4, 5), backend="onnxruntime", tolerances={"float64": (1e-9, 1e-7)}
    )
    (out,) = _accuracy(module).outputs
    assert (out.atol, out.rtol) == (1e-9, 1e-7)


def test_report_round_trips_with_random_outputs() -> None:
    module = pipeline.convert(Noise().eval(), torch.zeros(8, 8), backend="onnxruntime")
    data = module.report.to_dict()
    again = type(module.report).from_dict(data)
    assert again.accuracy is not None and again.accuracy.outputs[0].note == _accuracy(module).outputs[0].note
    assert "random" in again.summary()


class _BinaryCrossEntropy(torch.nn.Module):
    def forward(self, p: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.binary_cross_entropy(p, target)


def test_probabilities_are_drawn_as_probabilities_and_every_input_validates() -> None:
    """Inputs drawn like a sample of probabilities stay within [0, 1] (validation.draws): PyTorch takes all of them,
    none is dropped. (Before, plain normal draws left [0, 1] and PyTorch raised.)"""
    p, target = torch.tensor([0.2, 0.7, 0.9, 0.4]), torch.tensor([0.0, 1.0, 1.0, 0.0])
    module = pipeline.convert(_BinaryCrossEntropy().eval(), (p, target), validation_inputs=8, seed=3)
    accuracy = _accuracy(module)
    assert accuracy.passed and accuracy.inputs == 9 and accuracy.dropped == ()
    assert torch.allclose(module(p, target), torch.nn.functional.binary_cross_entropy(p, target), atol=1e-6)


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Add()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.inner(x, y) * 2


def test_an_output_out_of_tolerance_names_the_pytorch_op_and_module_that_computes_it() -> None:
    registry = _wrong_converter("Mul", "Add")
    with pytest.raises(AccuracyError, match=r"\[computed by aten\.mul\.Tensor in the model's forward") as info:
        pipeline.convert(Outer().eval(), (torch.tensor([1.0, 2.0, 3.0]), torch.ones(3)), converters=registry)
    assert "test_validate.Outer" in str(info.value)
