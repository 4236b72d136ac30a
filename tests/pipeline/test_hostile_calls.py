"""Hostile models, samples and calls: each a library error naming the cause with its fix, never a raw crash."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import pipeline


class Two(nn.Module):
    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return x * scale


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom inside forward")


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


LINEAR = nn.Linear(4, 3).eval()


@pytest.fixture(scope="module")
def module() -> pipeline.ConvertedModule:
    return pipeline.convert(LINEAR, torch.randn(2, 4), dynamic={"input": {0: ("batch", 1, 4, 8)}})


@pytest.fixture(scope="module")
def scaled() -> pipeline.ConvertedModule:
    return pipeline.convert(Two(), (torch.randn(2, 4),))


CONVERT_CASES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("function", lambda: pipeline.convert(lambda x: x, torch.randn(2, 4)), pipeline.InputError, "nn.Module"),
    ("class", lambda: pipeline.convert(nn.Linear, torch.randn(2, 4)), pipeline.InputError, "nn.Module"),
    ("none-model", lambda: pipeline.convert(None, torch.randn(2, 4)), pipeline.InputError, "nn.Module"),
    ("none-sample", lambda: pipeline.convert(LINEAR, None), pipeline.InputError, "cannot read a sample"),
    ("str-sample", lambda: pipeline.convert(LINEAR, "x"), pipeline.InputError, "cannot read a sample"),
    ("no-tensor", lambda: pipeline.convert(Two(), ((1.0,), {})), pipeline.InputError, "no tensor"),
    ("wrong-shape", lambda: pipeline.convert(LINEAR, torch.randn(2, 5)), pipeline.InputError, "fails on the sample"),
    ("int-sample", lambda: pipeline.convert(LINEAR, torch.ones(2, 4, dtype=torch.long)), pipeline.InputError, "fails"),
    ("forward-raises", lambda: pipeline.convert(Boom(), torch.randn(2, 4)), pipeline.InputError, "boom inside"),
    ("data-dependent", lambda: pipeline.convert(DataDependent(), torch.randn(2, 4)), pipeline.ExportError, "export"),
    ("empty", lambda: pipeline.convert(LINEAR, torch.randn(0, 4)), pipeline.InputError, "has no elements"),
    ("unknown-setting", lambda: pipeline.convert(LINEAR, torch.randn(2, 4), fp16=True), pipeline.InputError, "fp16"),
    (
        "dynamic-unknown-input",
        lambda: pipeline.convert(LINEAR, torch.randn(2, 4), dynamic={"y": {0: ("b", 1, 2, 4)}}),
        pipeline.InputError,
        "names input 'y'",
    ),
    (
        "dynamic-axis-out-of-rank",
        lambda: pipeline.convert(LINEAR, torch.randn(2, 4), dynamic={"input": {5: ("b", 1, 2, 4)}}),
        pipeline.InputError,
        "has no axis 5",
    ),
    (
        "sample-outside-range",
        lambda: pipeline.convert(LINEAR, torch.randn(16, 4), dynamic={"input": {0: ("b", 1, 4, 8)}}),
        pipeline.InputError,
        "size 16 on dynamic axis 0",
    ),
    (
        "sample-size-one-on-dynamic-axis",
        lambda: pipeline.convert(LINEAR, torch.randn(1, 4), dynamic={"input": {0: ("b", 1, 4, 8)}}),
        pipeline.InputError,
        ">= 2",
    ),
    (
        "sample-names-no-argument",
        lambda: pipeline.convert(LINEAR, ((), {"foo": torch.randn(2, 4)})),
        pipeline.InputError,
        "forward(input) has no argument 'foo'",
    ),
    ("unknown-backend", lambda: pipeline.convert(LINEAR, torch.randn(2, 4), backend="cuda"), pipeline.InputError, ""),
    (
        "tensorrt-missing",
        lambda: pipeline.convert(LINEAR, torch.randn(2, 4), backend="tensorrt"),
        pipeline.BuildError,
        "TensorRT",
    ),
]


@pytest.mark.parametrize(("make", "error", "cause"), [c[1:] for c in CONVERT_CASES], ids=[c[0] for c in CONVERT_CASES])
def test_hostile_conversion(make: Callable[[], object], error: type[Exception], cause: str) -> None:
    with pytest.raises(error) as info:
        make()
    text = str(info.value)
    assert cause in text and "fix:" in text, text


CALL_CASES: list[tuple[str, Callable[[pipeline.ConvertedModule], object], str]] = [
    ("too-many-args", lambda m: m(torch.randn(2, 4), torch.randn(2, 4)), "too many positional"),
    ("unknown-kwarg", lambda m: m(torch.randn(2, 4), z=1), "forward(input) has no argument 'z'"),
    ("only-unknown-kwarg", lambda m: m(foo=torch.randn(2, 4)), "has no argument 'foo'; its arguments are: input"),
    ("missing-arg", lambda m: m(), "missing the required argument(s) 'input'"),
    ("dtype", lambda m: m(torch.ones(2, 4, dtype=torch.long)), "is int64, the graph takes float32"),
    ("rank", lambda m: m(torch.randn(2, 4, 1)), "has rank 3"),
    ("fixed-dim", lambda m: m(torch.randn(2, 5)), "fixed size 4"),
    ("above-range", lambda m: m(torch.randn(9, 4)), "outside the declared range [1, 8]"),
    ("numpy", lambda m: m(torch.randn(2, 4).numpy()), "must be a tensor"),
    ("list", lambda m: m([1.0, 2.0]), "differs from the sample's"),
    ("meta", lambda m: m(torch.randn(2, 4, device="meta")), "'input' is a meta tensor"),
]


@pytest.mark.parametrize(("call", "cause"), [c[1:] for c in CALL_CASES], ids=[c[0] for c in CALL_CASES])
def test_hostile_call(module: pipeline.ConvertedModule, call: Callable, cause: str) -> None:
    with pytest.raises(pipeline.InputError) as info:
        call(module)
    assert cause in str(info.value) and "fix:" in str(info.value), str(info.value)


def test_changed_constant_argument(scaled: pipeline.ConvertedModule) -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)exported with 2.0.*built in.*fix:"):
        scaled(torch.randn(2, 4), 3.0)


def test_input_that_requires_grad_warns_once_that_the_output_has_no_grad_fn(module: pipeline.ConvertedModule) -> None:
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.warns(UserWarning, match=r"input\(s\) 'input' require grad.*no grad_fn") as caught:
        out = module(x)
    assert out.grad_fn is None
    assert caught[0].filename == __file__  # it points at the caller's line, not at the library
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module(x)  # once per module
        with torch.no_grad():
            module(x)
