"""0-d sample inputs (``torch.linspace(start, end, n)`` with tensor bounds, a 0-d class index) convert and validate:
the validation feeds keep them 0-d, as the model needs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from rtx_build import assert_builds
from torch import nn

import pipeline


class Op(nn.Module):
    """forward(*tensors) = fn(*tensors)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.fn(*tensors)


def test_zero_dim_float_inputs_stay_zero_dim_in_validation() -> None:
    model = Op(lambda start, end: torch.linspace(start, end, 7))  # raises on 1-d bounds
    module = pipeline.convert(model, (torch.tensor(-1.0), torch.tensor(2.5)), backend="onnxruntime")
    assert module.report.accuracy is not None and module.report.accuracy.passed
    fresh = (torch.tensor(0.5), torch.tensor(4.0))
    torch.testing.assert_close(module(*fresh), model(*fresh))


def test_zero_dim_integer_inputs_validate() -> None:
    model = Op(lambda x, target: F.multi_margin_loss(x, target).reshape(1))
    module = pipeline.convert(model, (torch.randn(5), torch.tensor(1)), backend="onnxruntime")
    fresh = (torch.randn(5), torch.tensor(0))
    torch.testing.assert_close(module(*fresh), model(*fresh))
    assert_builds(module)
