"""``erfcx``, ``log_ndtr`` (overriding the exporter's overflowing formulas) and the regularized incomplete gamma
functions ``igamma``/``igammac`` (no ONNX translation): PyTorch against ONNX Runtime through ``pipeline.convert``
over their tails and boundary values, and the final graph built by the real TensorRT-RTX builder."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import pytest
import torch
from rtx_build import assert_builds
from torch import nn

import pipeline
from converters.aten.gamma import IGAMMA_STEPS


class Op(nn.Module):
    """forward(*tensors) = fn(*tensors)."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.fn(*tensors)


SPECIAL_EDGES = [0.0, -0.0, 1e-9, -1.0, -1.0001, -6.1, -9.5, -26.7, 49.99, 50.01, 6e7, math.inf, -math.inf, math.nan]


def _wide() -> torch.Tensor:
    """-120 .. 120 (both tails: erfcx overflows below -9.4, log_ndtr's exporter formula is -inf below -14)."""
    return torch.cat([torch.linspace(-120.0, 120.0, 601), torch.tensor(SPECIAL_EDGES)])


@pytest.mark.parametrize("fn", [torch.special.erfcx, torch.special.log_ndtr], ids=["erfcx", "log_ndtr"])
def test_erfcx_and_log_ndtr_match_pytorch_in_the_tails_and_build(fn: Callable[..., torch.Tensor]) -> None:
    model = Op(fn)
    module = pipeline.convert(model, (_wide(),), backend="onnxruntime")
    x = _wide() * 0.93  # not the sample
    torch.testing.assert_close(module(x), model(x), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert_builds(module)


@pytest.mark.parametrize("fn", [torch.special.erfcx, torch.special.log_ndtr], ids=["erfcx", "log_ndtr"])
def test_plain_export_loses_the_tails(fn: Callable[..., torch.Tensor]) -> None:
    """If this fails, torch's exporter fixed its translation: the override can go."""
    model = Op(fn)
    x = torch.tensor([-30.0, -12.0, 8.0, 30.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = torch.onnx.export(model, (x,), dynamo=True, verbose=False).model_proto
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    assert not np.allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5, equal_nan=True)


def _gamma_grid() -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` from 1e-3 to 250, ``x`` from 0 to 400: the series, the continued fraction, the Lanczos prefactor near
    ``x = a`` and the boundary values (0, inf, negative, NaN)."""
    a = torch.tensor([0.0, 1e-3, 0.1, 0.5, 1.0, 2.5, 7.0, 19.5, 33.0, 80.0, 150.0, 199.0, 250.0, math.inf, -1.0])
    x = torch.tensor([0.0, 1e-4, 0.3, 1.0, 1.05, 3.0, 7.5, 20.0, 31.0, 85.0, 150.0, 210.0, 400.0, math.inf, -2.0])
    grid_a, grid_x = torch.meshgrid(torch.cat([a, torch.tensor([math.nan])]), torch.cat([x, x[:1]]), indexing="ij")
    return grid_a.contiguous(), grid_x.contiguous()


@pytest.mark.parametrize("fn", [torch.special.gammainc, torch.special.gammaincc], ids=["igamma", "igammac"])
def test_incomplete_gamma_matches_pytorch_and_builds(fn: Callable[..., torch.Tensor]) -> None:
    model = Op(fn)
    sample = (torch.rand(16, 16) * 30.0, torch.rand(16, 16) * 40.0)
    module = pipeline.convert(model, sample, backend="onnxruntime")
    a, x = _gamma_grid()
    torch.testing.assert_close(module(a, x), model(a, x), rtol=1e-4, atol=1e-5, equal_nan=True)
    assert_builds(module)


def test_incomplete_gamma_is_nan_where_the_fixed_steps_do_not_converge() -> None:
    """Far beyond the range the Loop's trip count covers (a = 1e5 at x = a needs ~2000 terms): NaN, not a wrong
    number; a = 300 is still within it."""
    model = Op(torch.special.gammainc)
    a = torch.tensor([1e5, 300.0])
    module = pipeline.convert(model, (a, a.clone()), backend="onnxruntime", validate=False)
    got = module(a, a.clone())
    assert IGAMMA_STEPS < 2000
    assert torch.isnan(got[0])
    torch.testing.assert_close(got[1], model(a, a)[1], rtol=1e-4, atol=1e-5)
