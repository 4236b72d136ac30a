"""Composite functions traced through their static forms (pipeline/exporting/composites.py): ``cov`` and
``corrcoef`` (whose PyTorch code branches on a tensor's value) and ``combinations`` (whose PyTorch code goes
through ``masked_select``) convert, match PyTorch and build; what has no static form still fails clearly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from rtx_build import assert_builds

import pipeline
from converters.errors import ExportError


class _Call(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> Any:
        return self.fn(*xs)


CASES: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "cov-vector": (torch.cov, (5,)),
    "cov-matrix-correction0": (lambda x: torch.cov(x, correction=0), (3, 6)),
    "cov-method-too-few": (lambda x: x.cov(correction=2), (2, 2)),
    "corrcoef-matrix": (torch.corrcoef, (4, 7)),
    "corrcoef-vector": (lambda x: x.corrcoef(), (6,)),
    "combinations-pairs": (torch.combinations, (5,)),
    "combinations-replacement": (lambda x: torch.combinations(x, r=3, with_replacement=True), (4,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_static_form_converts_matches_and_builds(name: str) -> None:
    fn, shape = CASES[name]
    model = _Call(fn).eval()
    module = pipeline.convert(model, (torch.randn(shape),))
    assert not {n.op_type for n in module.onnx.graph.node} & {"NonZero", "Compress"}
    x = torch.randn(shape)
    torch.testing.assert_close(module(x), model(x), atol=1e-5, rtol=1e-4, equal_nan=True)
    assert_builds(module)


def test_weighted_cov_still_fails_clearly() -> None:
    """Weights make the degrees of freedom a tensor value: no static form, the export error names the op."""
    model = _Call(lambda x, w: torch.cov(x, aweights=w)).eval()
    with pytest.raises(ExportError, match=r"(?s)\[export\].*equal.*fix:"):
        pipeline.convert(model, (torch.randn(2, 5), torch.rand(5) + 0.5))


class _Stft(torch.nn.Module):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x: torch.Tensor, *window: torch.Tensor) -> torch.Tensor:
        return torch.stft(x, window=window[0] if window else None, return_complex=False, **self.kwargs)


@pytest.mark.parametrize(
    ("kwargs", "shape", "window"),
    [
        ({"n_fft": 10}, (100,), False),
        ({"n_fft": 16, "hop_length": 5, "win_length": 12, "normalized": True, "pad_mode": "constant"}, (3, 90), True),
        ({"n_fft": 8, "center": False}, (2, 40), False),
    ],
    ids=["opinfo", "window-batch-normalized", "not-centred"],
)
def test_stft_as_accurate_as_pytorch_and_builds(kwargs: dict[str, Any], shape: tuple[int, ...], window: bool) -> None:
    """Frames times a DFT matrix computed in float64: no STFT node (whose ONNX Runtime kernel is off by 4e-5 on a
    spectrum of 38), and within float32 rounding of the float64 result, as PyTorch's FFT is."""
    model = _Stft(**kwargs).eval()
    sample = (torch.randn(shape) * 4, *((torch.hann_window(kwargs.get("win_length", 0)),) if window else ()))
    module = pipeline.convert(model, sample)
    assert "STFT" not in {n.op_type for n in module.onnx.graph.node}
    exact = model(*(t.double() for t in sample))
    ours, theirs = module(*sample).double(), model(*sample).double()
    assert (ours - exact).abs().max() <= 2e-7 * exact.abs().max()
    assert (theirs - exact).abs().max() <= 2e-7 * exact.abs().max()  # the same bound holds for PyTorch's own
    torch.testing.assert_close(module(*sample), model(*sample), atol=1e-5, rtol=1e-4)
    assert_builds(module)


class _GaussianNll(torch.nn.Module):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.loss = torch.nn.GaussianNLLLoss(**kwargs)

    def forward(self, x: torch.Tensor, target: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        return self.loss(x, target, var)


@pytest.mark.parametrize(
    ("kwargs", "var_shape"),
    [({"reduction": "none"}, (4, 3)), ({"full": True}, (4,)), ({"reduction": "sum", "eps": 1e-3}, (4, 1))],
    ids=["none", "mean-full-homoscedastic", "sum-broadcast"],
)
def test_gaussian_nll_loss_matches_and_builds(kwargs: dict[str, Any], var_shape: tuple[int, ...]) -> None:
    """PyTorch checks ``torch.any(var < 0)`` on the data; traced without that branch, the same loss."""
    model = _GaussianNll(**kwargs).eval()
    sample = (torch.randn(4, 3), torch.randn(4, 3), torch.rand(var_shape) + 1)  # drawn neighbours stay positive
    module = pipeline.convert(model, sample)
    fresh = (torch.randn(4, 3), torch.randn(4, 3), torch.rand(var_shape) * 3)
    fresh[2].view(-1)[0] = 0.0  # clamped to eps, as in PyTorch
    torch.testing.assert_close(module(*fresh), model(*fresh), atol=1e-5, rtol=1e-4)
    assert_builds(module)


def test_gaussian_nll_loss_is_nan_where_pytorch_raises() -> None:
    """A negative variance: PyTorch raises, the graph cannot; the loss is NaN at that entry and nowhere else."""
    model = _GaussianNll(reduction="none").eval()
    x, target, var = torch.randn(2, 3), torch.randn(2, 3), torch.rand(2, 3) + 1
    module = pipeline.convert(model, (x, target, var))
    var[1, 2] = -0.5
    with pytest.raises(ValueError, match="negative"):
        model(x, target, var)
    loss = module(x, target, var)
    assert torch.isnan(loss).nonzero().tolist() == [[1, 2]]
    var[1, 2] = 0.5
    torch.testing.assert_close(loss[0], model(x, target, var)[0], atol=1e-5, rtol=1e-4)


class BufferWrittenBack(torch.nn.Module):
    """CTRL's way: ``forward`` assigns its buffer the buffer's own ``.to`` (unchanged): the unchanged ``.to`` form
    made a buffer write outside any module, which torch.export's verifier refused; traced again without it."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Buffer(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        self.table = self.table.to(device=x.device, dtype=x.dtype)
        return self.table[ids] + x


def test_a_buffer_assigned_its_unchanged_to_in_forward_converts() -> None:
    ids, x = torch.tensor([[1, 5, 7]]), torch.randn(1, 3, 4)
    model = BufferWrittenBack().eval()
    module = pipeline.convert(model, (ids, x), validation_inputs=1)
    torch.testing.assert_close(module(ids, x), model(ids, x), rtol=0, atol=0)


class _TableWrittenThroughData(torch.nn.Module):
    """CogVideoX's patch embedding at another size than its config's: a table built in forward and written through
    ``.data``, read by the rest of the model."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        joint = x.new_zeros(1, x.shape[1], x.shape[2])
        joint.data[:, 2:].copy_(torch.sin(x[:, 2:] * 3))
        return x + joint


def test_a_tensor_written_through_data_in_forward_converts_and_matches() -> None:
    model, x = _TableWrittenThroughData(), torch.randn(1, 5, 3, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, x)
    other = torch.randn(1, 5, 3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(module(other), model(other))
    assert_builds(module)


def test_a_group_norm_of_a_non_contiguous_tensor_is_traced() -> None:
    """ConsistencyDecoderVAE's UNet normalises a tensor whose strides PyTorch's tracing kernel refuses ("Expected
    X.is_contiguous(memory_format)"); made contiguous, the trace goes on to the model's real limit, its scheduler's
    decision on a value read from a tensor, named with its fix."""
    import tests_environment  # noqa: F401 -- torchvision's operator schemas, before diffusers' models
    from model_sources.diffusers_all_models import build

    model, (_, kwargs) = build("ConsistencyDecoderVAE")
    with pytest.raises(ExportError) as caught:
        pipeline.convert(model, kwargs)
    assert "is_contiguous" not in str(caught.value) and "data-dependent" in str(caught.value)
