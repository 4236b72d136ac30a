"""The converters that override the exporter's translation, on inputs that expose the exporter's bug: PyTorch
against ONNX Runtime through ``pipeline.convert``, the final graph built by the real TensorRT-RTX builder, and
plain ``torch.onnx.export`` shown wrong on the same inputs (the reason the override exists)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from rtx_build import assert_builds
from torch import nn

import pipeline
from converters.aten.overrides import pool_sizes_known
from converters.settings import Settings


class Op(nn.Module):
    """forward(*tensors) = fn(*tensors)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.fn(*tensors)


def _plain_export(model: nn.Module, args: tuple[torch.Tensor, ...]) -> np.ndarray | None:
    """Plain torch.onnx.export run on ONNX Runtime: the first output, or None when the graph fails to run."""
    try:  # e.g. diagonal_scatter fails to export; scatter_reduce with a src larger than the index fails to run
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            proto = torch.onnx.export(model, args, dynamo=True, verbose=False).model_proto
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
        return np.asarray(session.run(None, feeds)[0])
    except Exception:
        return None


def _rows(n: int, width: int) -> torch.Tensor:
    return torch.randn(n, width)


INDEX = torch.tensor([[0, 1, 0, 0, 2, 2], [3, 3, 3, 1, 3, 0]])  # repeated indices in each row

CASES: dict[str, tuple[Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "avg_pool2d-divisor": (
        lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, divisor_override=2),
        lambda: (torch.randn(2, 3, 9, 8),),
    ),
    "avg_pool2d-divisor-ceil-unbatched": (
        lambda x: F.avg_pool2d(x, (3, 2), stride=2, padding=1, ceil_mode=True, divisor_override=5),
        lambda: (torch.randn(3, 8, 7),),
    ),
    "avg_pool3d-divisor": (
        lambda x: F.avg_pool3d(x, 2, stride=(1, 2, 2), divisor_override=3),
        lambda: (torch.randn(1, 2, 4, 5, 6),),
    ),
    "logsigmoid-large": (F.logsigmoid, lambda: (torch.linspace(-150.0, 40.0, 96).reshape(4, 24),)),
    "scatter_reduce-mean-include_self": (
        lambda x, src: x.scatter_reduce(1, INDEX, src, "mean", include_self=True),
        lambda: (_rows(2, 4), _rows(2, 7)),
    ),
    "scatter_reduce-mean-exclude_self": (
        lambda x, src: x.scatter_reduce(1, INDEX, src, "mean", include_self=False),
        lambda: (_rows(2, 5), _rows(2, 6)),
    ),
    "logcumsumexp-far-prefix": (
        lambda x: torch.logcumsumexp(torch.cat([x - 200.0, x], dim=1), dim=1),
        lambda: (_rows(3, 5),),
    ),
    "batch_norm-training": (
        lambda x, w, b: F.batch_norm(x, torch.zeros(4), torch.ones(4), w, b, training=True, momentum=0.3, eps=0.1),
        lambda: (torch.randn(3, 4, 5, 2) * 3 + 2, torch.randn(4), torch.randn(4)),
    ),
    "diagonal_scatter": (
        lambda x, src: torch.diagonal_scatter(x, src, offset=1, dim1=-1, dim2=0),
        lambda: (torch.randn(5, 2, 4), torch.randn(2, 4)),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_override_matches_pytorch_and_builds(name: str) -> None:
    fn, make = CASES[name]
    model = Op(fn)
    module = pipeline.convert(model, make(), backend="onnxruntime")
    fresh = make()  # not the sample
    torch.testing.assert_close(module(*fresh), model(*fresh), rtol=1e-5, atol=1e-6)
    assert_builds(module)


@pytest.mark.parametrize("name", list(CASES))
def test_plain_export_gets_these_inputs_wrong(name: str) -> None:
    """If this fails, torch's exporter fixed its translation: the override can go."""
    fn, make = CASES[name]
    model = Op(fn)
    args = make()
    want = model(*args).numpy()
    got = _plain_export(model, args)
    assert got is None or got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_every_reduction(reduce: str, include_self: bool) -> None:
    model = Op(lambda x, src: x.scatter_reduce(1, INDEX, src, reduce, include_self=include_self))
    module = pipeline.convert(model, (_rows(2, 4), _rows(2, 6)), backend="onnxruntime")
    fresh = (_rows(2, 4), _rows(2, 6))
    torch.testing.assert_close(module(*fresh), model(*fresh), rtol=1e-5, atol=1e-6)
    assert_builds(module)


def test_scatter_reduce_integer_mean_floors_like_pytorch() -> None:
    model = Op(lambda x, src: x.scatter_reduce(0, torch.tensor([0, 0, 1, 1, 1]), src, "mean"))
    sample = (torch.tensor([5, -7, 3]), torch.tensor([-4, 2, 8, -9, 1]))
    module = pipeline.convert(model, sample, backend="onnxruntime")
    fresh = (torch.tensor([-3, 10, 2]), torch.tensor([7, -2, -5, 4, 6]))
    assert torch.equal(module(*fresh), model(*fresh))


def test_logcumsumexp_keeps_infinities_like_pytorch() -> None:
    model = Op(lambda x: torch.logcumsumexp(x, dim=-1))
    module = pipeline.convert(model, torch.randn(2, 4), backend="onnxruntime", validate=False)
    x = torch.tensor([[-torch.inf, -torch.inf, 0.0, 1.0], [1.0, torch.inf, 2.0, -torch.inf]])
    torch.testing.assert_close(module(x), model(x))


def test_avg_pool_without_divisor_override_is_unchanged() -> None:
    model = Op(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False))
    module = pipeline.convert(model, torch.randn(2, 3, 8, 8), backend="onnxruntime")
    assert [n.op_type for n in module.onnx.graph.node] == ["AveragePool"]
    fresh = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(module(fresh), model(fresh))


def test_aminmax_without_dim_exports() -> None:
    model = Op(lambda x: tuple(torch.aminmax(x)))
    module = pipeline.convert(model, torch.randn(4, 5), backend="onnxruntime")
    x = torch.randn(4, 5)
    got, want = module(x), model(x)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert_builds(module)


def test_ceil_mode_divisor_override_needs_static_spatial_sizes() -> None:
    def node(shape: list[int | str], **attrs: object) -> gs.Node:
        x = gs.Variable("x", dtype=np.float32, shape=shape)
        return gs.Node("avg_pool2d", attrs={"kernel_size": [3], **attrs}, inputs=[x], outputs=[gs.Variable("y")])

    settings = Settings()
    assert pool_sizes_known(node([1, 2, 9, 9], ceil_mode=1, divisor_override=2), settings)
    assert not pool_sizes_known(node([1, 2, "h", 9], ceil_mode=1, divisor_override=2), settings)
    assert pool_sizes_known(node([1, 2, "h", 9], ceil_mode=0, divisor_override=2), settings)
    assert pool_sizes_known(node([1, 2, "h", 9], ceil_mode=1), settings)


def test_batch_norm_in_eval_mode_keeps_the_exporters_translation() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    model[1].running_mean.uniform_(-1, 1)
    module = pipeline.convert(model, torch.randn(2, 3, 8, 8), backend="onnxruntime")
    fresh = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(module(fresh), model(fresh))


def test_overrides_in_float16() -> None:
    """Half inputs: batch norm keeps its statistics in float32 as PyTorch does; the others compute in float16."""
    cases: list[tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = [
        (
            lambda x, w, b: F.batch_norm(x, torch.zeros(4, dtype=x.dtype), torch.ones(4, dtype=x.dtype), w, b, True),
            (torch.randn(3, 4, 5), torch.randn(4), torch.randn(4)),
        ),
        (lambda x: F.avg_pool2d(x, 3, 2, 1, divisor_override=2), (torch.randn(2, 3, 9, 8),)),
        (lambda x, src: x.scatter_reduce(1, INDEX, src, "mean", include_self=False), (_rows(2, 4), _rows(2, 6))),
    ]
    for fn, args in cases:
        half = tuple(a.half() for a in args)
        module = pipeline.convert(Op(fn), half, backend="onnxruntime")
        got, want = module(*half), Op(fn)(*half)
        assert got.dtype == torch.float16
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
