"""The pointwise and numeric ATen/prims converters (``converters/aten/pointwise.py`` and siblings): every declared
case converts, matches PyTorch on ONNX Runtime and builds with the real TensorRT-RTX builder; PyTorch's own
OpInfo samples of each op do too; corner values (NaN, signed zeros, domain edges) match PyTorch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import pipeline
from converters.aten.pointwise import register_aten1_converters
from converters.cases import ConverterCase, collect_cases
from converters.defaults import default_registry
from converters.registry import ConverterEntry, ConverterRegistry
from tests.rtx_build import assert_builds

OWN = ConverterRegistry()
register_aten1_converters(OWN)
CASES = collect_cases(OWN)
REGISTRY = default_registry()


@pytest.mark.parametrize(("entry", "case"), CASES, ids=[f"{e.key}-{c.name}" for e, c in CASES])
def test_case_builds_with_tensorrt_rtx(entry: ConverterEntry, case: ConverterCase) -> None:
    generator = torch.Generator().manual_seed(1)
    sample = tuple(torch.randn(shape, generator=generator) for shape, _ in case.inputs)
    module = pipeline.convert(case.module().eval(), sample, converters=REGISTRY, dynamic=case.dynamic)
    assert not [n for n in module.onnx.graph.node if n.op_type == entry.key.op_type and n.domain == entry.key.domain]
    assert_builds(module)


class _OpInfoSample(torch.nn.Module):
    """An OpInfo sample as a module whose inputs are the sample's tensors (the rest is fixed)."""

    def __init__(self, op: Any, sample: Any) -> None:
        super().__init__()
        self.op = op
        leaves, self.spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
        self.is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
        self.constants = [None if t else x for x, t in zip(leaves, self.is_tensor, strict=True)]
        self.tensors = tuple(x for x, t in zip(leaves, self.is_tensor, strict=True) if t)

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        leaves = [next(it) if t else c for t, c in zip(self.is_tensor, self.constants, strict=True)]
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        out = self.op(inp, *args, **kwargs)
        # namedtuples (cummax, median.dim, ...) as plain tuples: their export is the export stage's fix of issue 14
        return tuple(out) if isinstance(out, tuple) else out


#: OpInfo entries whose export needs a converter of these modules (the first usable sample of each is run).
OPINFO_OPS = [
    "copysign", "cumprod", "fmax", "fmin", "i0", "special.i0e", "special.i1", "special.i1e",
    "special.bessel_j0", "special.bessel_j1", "special.bessel_y0", "special.bessel_y1",
    "special.modified_bessel_i0", "special.modified_bessel_i1", "special.modified_bessel_k0",
    "special.modified_bessel_k1", "special.scaled_modified_bessel_k0", "special.scaled_modified_bessel_k1",
    "special.spherical_bessel_j0", "special.airy_ai", "special.ndtri",
    "special.chebyshev_polynomial_t", "special.chebyshev_polynomial_u", "special.chebyshev_polynomial_v",
    "special.chebyshev_polynomial_w", "special.hermite_polynomial_h", "special.hermite_polynomial_he",
    "special.laguerre_polynomial_l", "special.legendre_polynomial_p", "special.shifted_chebyshev_polynomial_t",
    "special.shifted_chebyshev_polynomial_u", "special.shifted_chebyshev_polynomial_v",
    "special.shifted_chebyshev_polynomial_w", "lgamma", "digamma", "erfinv", "hypot", "special.zeta",
    "mvlgamma.mvlgamma_p_1", "mvlgamma.mvlgamma_p_3", "mvlgamma.mvlgamma_p_5", "polygamma.polygamma_n_0",
    "polygamma.polygamma_n_1", "polygamma.polygamma_n_2", "polygamma.polygamma_n_3", "polygamma.polygamma_n_4",
    "special.polygamma.special_polygamma_n_0", "median", "nanmedian", "cummax", "cummin",
    "masked.median", "masked.cumprod", "frexp", "nextafter",
]  # fmt: skip


def _opinfo_sample(name: str) -> tuple[Any, Any]:
    """The OpInfo entry ``name`` and its first float32 sample that has elements and to which eager PyTorch gives a
    value. Made in the test, not at collection: ``op_db``'s import and the samples cost every worker seconds."""
    from opinfo_support import all_ops

    op = all_ops()[name]
    sample = next((s for s in op.sample_inputs("cpu", torch.float32) if _has_elements(s) and _compares(op, s)), None)
    assert sample is not None, f"OpInfo gives {name} no usable float32 sample: take it off OPINFO_OPS"
    return op, sample


def _compares(op: Any, sample: Any) -> bool:
    """Eager PyTorch gives the sample a value somewhere: an output NaN at every element compares nothing, and the
    validation refuses to call it a match."""
    with torch.no_grad():
        out = op.op(sample.input, *sample.args, **sample.kwargs)
    floats = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return not floats or not all(bool(t.isnan().all()) for t in floats)


def _has_elements(sample: Any) -> bool:
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    # 0-d samples wait for the validation fix of issue 14 (a 0-d output crashes the comparison today)
    return bool(tensors) and all(t.numel() > 0 and t.ndim > 0 for t in tensors)


@pytest.mark.parametrize("name", OPINFO_OPS, ids=[f"{name}-0" for name in OPINFO_OPS])
def test_opinfo_sample_converts_matches_and_builds(name: str) -> None:
    op, sample = _opinfo_sample(name)
    model = _OpInfoSample(op.op, sample).eval()
    module = pipeline.convert(model, model.tensors)  # validates against PyTorch on ONNX Runtime
    with torch.no_grad():
        torch.testing.assert_close(module(*model.tensors), model(*model.tensors), atol=1e-5, rtol=1e-4, equal_nan=True)
    assert_builds(module)


class _Unary(torch.nn.Module):
    def __init__(self, function: Any) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


@pytest.mark.parametrize(
    ("function", "values"),
    [
        (torch.special.ndtri, [0.0, 1.0, -0.5, 1.5, 1e-30, 0.5, 0.9, 1e-3, 0.999]),
        (torch.special.modified_bessel_k0, [0.0, -1.0, 1e-3, 2.0, 2.0001, 50.0]),
        (torch.special.bessel_y1, [0.0, -1.0, 1e-3, 5.0, 5.001, 80.0]),
        (torch.special.airy_ai, [-50.0, -2.0899, -2.09, 0.0, 2.0899, 2.09, 9.0, 104.0]),
        (torch.special.spherical_bessel_j0, [0.0, 0.4999, 0.5, -3.0, float("inf")]),
        (torch.i0, [0.0, 7.999, 8.0, -8.001, 30.0]),
        (torch.lgamma, [0.0, -1.0, -2.5, 1.0, 2.0, 0.5, 1e-3, 30.0, -7.3]),
        (torch.digamma, [0.0, -0.0, -1.0, -2.5, 1.0, 10.0, 9.99, 1e-3, -7.3]),
        (torch.erfinv, [-1.0, 1.0, 1.5, 0.0, 0.7, 0.7001, -0.99, 0.999]),
    ],
    ids=["ndtri", "k0", "y1", "airy_ai", "spherical_j0", "i0", "lgamma", "digamma", "erfinv"],
)
def test_domain_edges_match_pytorch(function: Any, values: list[float]) -> None:
    x = torch.tensor(values)
    module = pipeline.convert(_Unary(function), (torch.rand(len(values)) * 0.5 + 0.2,), validate=False)
    torch.testing.assert_close(module(x), function(x), atol=1e-5, rtol=1e-4, equal_nan=True)


def test_copysign_signed_zero_and_nan_sides() -> None:
    a = torch.tensor([1.5, -2.0, 3.0, -4.0, 0.0, torch.nan])
    b = torch.tensor([-0.0, 0.0, -1.0, 2.0, -3.0, 1.0])
    module = pipeline.convert(_Binary(torch.copysign), (torch.randn(6), torch.randn(6)), validate=False)
    torch.testing.assert_close(module(a, b), torch.copysign(a, b), equal_nan=True)
    fmax = pipeline.convert(_Binary(torch.fmax), (torch.randn(3), torch.randn(3)), validate=False)
    left, right = torch.tensor([torch.nan, 1.0, torch.nan]), torch.tensor([2.0, torch.nan, torch.nan])
    torch.testing.assert_close(fmax(left, right), torch.tensor([2.0, 1.0, torch.nan]), equal_nan=True)


class _Binary(torch.nn.Module):
    def __init__(self, function: Any) -> None:
        super().__init__()
        self.function = function

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.function(a, b)


def test_zeta_poles_and_domain() -> None:
    x = torch.tensor([1.0, 0.5, 2.0, 3.0, 2.5, 4.0, 2.0])
    q = torch.tensor([1.0, 1.0, 0.0, -2.0, -1.5, -1.5, 30.0])
    module = pipeline.convert(_Binary(torch.special.zeta), (torch.rand(7) + 2.0, torch.rand(7) + 1.0))
    torch.testing.assert_close(module(x, q), torch.special.zeta(x, q), atol=1e-5, rtol=1e-4, equal_nan=True)


class _Stats(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        running = torch.cummax(x, 1)
        middle = torch.median(x, 1)
        return running.values, running.indices, middle.values, torch.nanmedian(x, 1).values


def test_nan_in_running_max_and_medians() -> None:
    """A NaN stays in cummax from where it appears (index: its first position); median is NaN in its row;
    nanmedian skips it."""
    x = torch.tensor([[1.0, 3.0, torch.nan, 5.0, 2.0], [2.0, 2.0, 1.0, 4.0, 4.0]])
    module = pipeline.convert(_Stats(), (torch.randn(2, 5),))
    for got, want in zip(module(x), _Stats()(x), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_polynomial_degree_above_the_samples() -> None:
    """The Loop runs as many steps as the largest degree asks: n = 30 with n = 0 and n = -2 beside it."""
    x = torch.tensor([0.3, -0.7, 1.2, 0.3, 0.9])
    n = torch.tensor([30.0, 30.0, 3.0, 0.0, -2.0])
    module = pipeline.convert(_Binary(torch.special.legendre_polynomial_p), (torch.rand(5), torch.ones(5)))
    torch.testing.assert_close(module(x, n), torch.special.legendre_polynomial_p(x, n), atol=1e-5, rtol=1e-4)


class _FrexpAndNext(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mantissa, exponent = torch.frexp(a)
        return mantissa, exponent, torch.nextafter(a, b)


def test_frexp_and_nextafter_are_bit_exact() -> None:
    """One ulp is inside any tolerance: these compare exactly (zeros, subnormals, powers of two, infinities)."""
    a = torch.tensor([0.0, 1.0, 1.0, -0.5, 2.0, 3e38, 0.3, -7.0, 1e-40, float("inf"), 0.75, -1e-30])
    b = torch.tensor([1.0, 1.0, 0.0, -1.0, 5.0, float("inf"), -1.0, 3.0, 1.0, 0.0, 0.75, 0.0])
    module = pipeline.convert(_FrexpAndNext(), (torch.rand(12) + 0.1, torch.rand(12)))
    for got, want in zip(module(a, b), _FrexpAndNext()(a, b), strict=True):
        assert torch.equal(got, want), (got, want)
