"""The accuracy rule anchored to PyTorch's own precision: outputs PyTorch itself cannot compute closer than the fixed
tolerance pass (fp32 against a float64 run, fp16 against PyTorch's own float16), a planted 1% error still fails, a
model that cannot run in float64 keeps the fixed rule and says so, and tensors too small for an RMS get no RMS
verdict."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import pipeline
from converters.settings import DEFAULT_TOLERANCES
from pipeline.accuracy.anchor import FACTORS, PrecisionMode, anchored_tolerance
from pipeline.accuracy.stats import RMS_MIN_ELEMENTS, ErrorAccumulator, tolerance_ratio

FLOAT32, FLOAT16 = DEFAULT_TOLERANCES["float32"], DEFAULT_TOLERANCES["float16"]


class Differences(nn.Module):
    """Two outputs, each the difference of two linear layers whose weights are 0.9 and 0.8 of each other: the
    difference cancels most of each term, so rounding, PyTorch's own included, is 10x and 5x its usual share."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(256, 256) for _ in range(4))
        with torch.no_grad():
            for layer in (self.a, self.c):
                layer.weight.mul_(scale)
                layer.bias.mul_(scale)
            for near, far, k in ((self.b, self.a, 0.9), (self.d, self.c, 0.8)):
                near.weight.copy_(far.weight * k)
                near.bias.copy_(far.bias * k)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x) - self.b(x), self.c(x) - self.d(x)


def differences(scale: float) -> nn.Module:
    torch.manual_seed(0)
    return Differences(scale).eval()


def sample() -> torch.Tensor:
    return torch.randn(8, 256, generator=torch.Generator().manual_seed(1))


def fixed_ratios(module: pipeline.ConvertedModule, model: nn.Module, tolerance: pipeline.Tolerance) -> list[float]:
    """How far each output is from failing the fixed tolerance on the sample (above 1: it fails)."""
    with torch.no_grad():
        got, want = module(sample()), model(sample())
    return [tolerance_ratio(g.numpy(), w.numpy(), tolerance) for g, w in zip(got, want, strict=True)]


def one_percent_off(model: nn.Module, layers: tuple[str, ...]) -> nn.Module:
    """``model`` with ``layers`` 1% larger: the outputs they make are 1% off."""
    broken = copy.deepcopy(model)
    with torch.no_grad():
        for name in layers:
            for tensor in getattr(broken, name).parameters():
                tensor.mul_(1.01)
    return broken


# -- fp32: against a float64 run ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fp32() -> tuple[nn.Module, pipeline.ConvertedModule]:
    model = differences(1000.0)
    return model, pipeline.convert(model, sample(), backend="onnxruntime")


def test_fp32_outputs_as_far_from_pytorch_as_pytorch_is_from_float64_pass(
    fp32: tuple[nn.Module, pipeline.ConvertedModule],
) -> None:
    model, module = fp32
    assert min(fixed_ratios(module, model, FLOAT32)) > 1  # the fixed rule fails both outputs ...
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.passed  # ... the anchored one passes them, and says why
    for output in accuracy.outputs:
        assert "the fixed tolerance failed on" in output.note and "PyTorch float64 vs float32" in output.note
        assert output.max_abs > output.atol and output.atol_used > output.atol
    assert "2x (float32: of PyTorch float32 or of the float64 answer)" in accuracy.rule


def test_fp32_planted_one_percent_error_fails(fp32: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    model, module = fp32
    report = pipeline.compare(one_percent_off(model, ("c", "d")), [sample()], module=module)
    passed = {o.output: o.passed for o in report.outputs}
    assert passed == {"out_0": True, "out_1": False}


def test_a_model_that_cannot_run_in_float64_keeps_the_fixed_rule_and_says_why(
    fp32: tuple[nn.Module, pipeline.ConvertedModule],
) -> None:
    class Float32Only(Differences):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if self.a.weight.dtype != torch.float32:
                raise TypeError("this model runs in float32 only")
            return super().forward(x)

    torch.manual_seed(0)
    report = pipeline.compare(Float32Only(1000.0).eval(), [sample()], module=fp32[1])
    assert not report.passed
    for output in report.outputs:
        assert not output.passed and "PyTorch cannot run the model in float64 (TypeError" in output.note
        assert output.note.endswith("the fixed tolerance stands")


# -- fp16: against PyTorch's own float16 ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fp16() -> tuple[nn.Module, pipeline.ConvertedModule]:
    model = differences(10.0)
    return model, pipeline.convert(model, sample(), backend="onnxruntime", precision="fp16")


def test_fp16_outputs_within_pytorch_half_error_pass_and_a_planted_error_fails(
    fp16: tuple[nn.Module, pipeline.ConvertedModule],
) -> None:
    model, module = fp16
    assert fixed_ratios(module, model, FLOAT16)[0] > 1  # out_0: 10x cancellation, beyond the fixed 0.2% RMS
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.passed
    loose = accuracy.outputs[0]
    assert loose.relative_rms > FLOAT16.rms and "PyTorch float16 vs float32" in loose.note
    assert module.report.precision is not None
    notes = module.report.precision.notes
    assert any("the fixed float16 tolerance fails on the calibration inputs" in n for n in notes)
    report = pipeline.compare(
        one_percent_off(model, ("c", "d")), [sample()], module=module
    )  # out_1: PyTorch's own is 0.2%
    assert {o.output: o.passed for o in report.outputs} == {"out_0": True, "out_1": False}


def test_anchored_tolerance_is_the_factor_over_pytorch_error_and_never_below_the_fixed_one() -> None:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(1000)
    own = reference + 0.004 * rng.standard_normal(1000)  # PyTorch's own half error: 0.4% RMS
    widened, line = anchored_tolerance(FLOAT16, reference, own, "float16")
    assert widened.rms == pytest.approx(FACTORS["float16"] * 0.004, rel=0.1) and "RMS" in line
    assert tolerance_ratio(reference + 2.5 * (own - reference), reference, widened) <= 1
    assert tolerance_ratio(reference * 1.01 + (own - reference), reference, widened) > 1  # 1% beyond 3x 0.4%
    exact = anchored_tolerance(FLOAT16, reference, reference, "float16")[0]
    assert exact == FLOAT16


def test_fp32_anchored_tolerance_is_twice_pytorch_float32_distance_from_float64() -> None:
    """An fp32 output as close to float64 as PyTorch float32 is lies within 2x PyTorch's distance of PyTorch
    (the triangle inequality); the factor is pinned from both sides: 1.9x that distance passes, 2.1x fails."""
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(1000)
    own = reference + 1e-3 * rng.standard_normal(1000)  # PyTorch float32 vs float64: ~30x the fixed 1e-4 rtol
    widened, line = anchored_tolerance(FLOAT32, reference, own, "float32")
    assert "PyTorch float64 vs float32: max" in line
    worst = float(np.abs(own - reference).max())
    signs = np.where(rng.standard_normal(1000) > 0, 1.0, -1.0)
    assert tolerance_ratio(reference + 1.9 * worst * signs, reference, widened) <= 1
    off = reference.copy()
    off[123] += 2.1 * worst  # one element beyond 2x
    assert tolerance_ratio(off, reference, widened) > 1
    assert anchored_tolerance(FLOAT32, reference, reference, "float32")[0] == FLOAT32


def test_pytorch_overflowing_its_own_half_type_is_said_not_hidden() -> None:
    """A model whose values leave float16's range (timm's visformer with random weights: PyTorch's own float16 is
    inf everywhere) has no half-precision error to anchor to: the fixed rule stands and the line says why."""
    reference = np.random.default_rng(0).standard_normal(1000)
    widened, line = anchored_tolerance(FLOAT16, reference, np.full(1000, np.inf), "float16")
    assert widened is FLOAT16
    assert "inf or NaN on 1000 of 1000 elements" in line and "bfloat16 has float32's range" in line
    assert "no anchor" in line
    partly = reference + 0.004
    partly[:10] = np.nan
    widened, line = anchored_tolerance(FLOAT16, reference, partly, "float16")
    assert widened.rms > FLOAT16.rms and "inf or NaN on 10 of 1000" in line and "finite rest" in line
    assert anchored_tolerance(FLOAT16, reference, reference + 0.004, "float16")[1].count("NaN") == 0


# -- the parts -----------------------------------------------------------------------------------------------------


def test_small_tensors_get_no_rms_verdict() -> None:
    rng = np.random.default_rng(0)
    for size, failed in ((RMS_MIN_ELEMENTS - 1, 0), (RMS_MIN_ELEMENTS, 1)):
        reference = rng.standard_normal(size)
        accumulator = ErrorAccumulator(FLOAT16)
        accumulator.add(reference * 1.004, reference)  # 0.4% of RMS: twice the RMS bound, within elementwise
        assert accumulator.result().rms_failed == failed


def test_precision_mode_computes_tensors_the_model_makes_itself_in_float64() -> None:
    class Grid(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(1, 1, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            grid = torch.linspace(0, 1, x.shape[-1])  # float32, made in forward (what model.double() misses)
            return self.conv(x) * grid + x.float() / 3

    torch.manual_seed(0)
    model, x = Grid().eval(), torch.randn(1, 1, 7)
    state = {k: v.double() for k, v in model.state_dict().items()}
    with torch.no_grad(), PrecisionMode(torch.float64) as mode:
        out = torch.func.functional_call(model, state, (x.double(),))
    exact = torch.nn.functional.conv1d(x.double(), state["conv.weight"], state["conv.bias"], padding=1)
    exact = exact * torch.linspace(0, 1, 7, dtype=torch.float64) + x.double() / 3
    assert out.dtype == torch.float64 and not mode.float32_ops
    assert torch.allclose(out, exact, rtol=1e-6, atol=1e-12)  # the grid's float32 rounding only (1e-8)


@pytest.mark.parametrize("spatial", [1, 2])
def test_depthwise_convolutions_run_written_out_in_float64_as_pytorch_computes_them(
    spatial: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch's float64 depthwise convolution is 10-50x slower than its float32 one (minutes of a Mamba's
    validation): the float64 run writes it out (windows times taps) and gets PyTorch's float64 values, for a channel
    multiplier, stride, padding and dilation; a convolution that is not depthwise keeps PyTorch's kernel."""
    from pipeline.accuracy import anchor

    written: list[int] = []
    convolution = torch.ops.aten.convolution.default

    def counted(*args: Any) -> torch.Tensor:
        out = anchor._depthwise_convolution(*args)  # raises NotImplementedError for another form: not counted
        written.append(args[-1])
        return out

    monkeypatch.setitem(anchor._FASTER_IN_FLOAT64, convolution, counted)
    conv = nn.functional.conv1d if spatial == 1 else nn.functional.conv2d
    torch.manual_seed(0)
    x = torch.randn(2, 6, *([13] * spatial))
    for weight, options in (
        (torch.randn(12, 1, *([3] * spatial)), {"stride": 2, "padding": 2, "dilation": 2, "groups": 6}),
        (torch.randn(6, 1, *([4] * spatial)), {"padding": 3, "groups": 6}),
        (torch.randn(4, 6, *([3] * spatial)), {"padding": 1}),  # not depthwise: PyTorch's kernel
    ):
        bias = torch.randn(weight.shape[0])
        with torch.no_grad(), PrecisionMode(torch.float64) as mode:
            out = conv(x, weight, bias, **options)
        exact = conv(x.double(), weight.double(), bias.double(), **options)
        assert out.dtype == torch.float64 and not mode.float32_ops
        torch.testing.assert_close(out, exact, rtol=0, atol=1e-12)
    assert written == [6, 6]
