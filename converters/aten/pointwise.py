"""Built-in converters for pointwise and numeric ATen and prims ops the torch exporter cannot translate.

``register_aten1_converters`` is the one list of what this module and its siblings add to the default registry:
elementwise ops here, the ``Math.h`` special functions in :mod:`converters.aten.special`, the orthogonal
polynomials in :mod:`converters.aten.polynomials`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.aten.gamma import register_gamma_converters
from converters.aten.numeric.math_builder import Math
from converters.aten.order_stats import register_order_stat_converters
from converters.aten.polynomials import register_polynomial_converters
from converters.aten.special import register_special_converters
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry


def _math(ctx: ConverterContext) -> Math:
    dtype = next((d for d in ctx.input_dtypes if d is not None), np.dtype(np.float32))
    return Math(ctx, dtype)


class _Binary(torch.nn.Module):
    """``function(a, b)`` with a few NaNs planted in both inputs (at different places)."""

    def __init__(self, function: object) -> None:
        super().__init__()
        self.function = function

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = torch.where(a > 1.2, torch.nan, a)
        b = torch.where((b < -1.2) & ~a.isnan(), torch.nan, b)
        return self.function(a, b)  # type: ignore[operator]


@converter_case(lambda: _Binary(torch.fmax), inputs=[((6, 7), "float32"), ((7,), "float32")])
def convert_fmax(ctx: ConverterContext) -> gs.Tensor:
    """``prims::fmax``: the larger value, ignoring a NaN on one side (NaN only where both are)."""
    m = _math(ctx)
    a, b = m.wrap(ctx.inputs[0]), m.wrap(ctx.inputs[1])
    both = m.apply("Max", a, b)
    return m.where(m.isnan(a), b, m.where(m.isnan(b), a, both)).tensor


@converter_case(
    lambda: _Binary(torch.fmin),
    inputs=[((2, 6, 7), "float32"), ((2, 6, 7), "float32")],
    dynamic={"a": {0: ("batch", 1, 2, 4)}, "b": {0: ("batch", 1, 2, 4)}},
)
def convert_fmin(ctx: ConverterContext) -> gs.Tensor:
    """``prims::fmin``: the smaller value, ignoring a NaN on one side (NaN only where both are)."""
    m = _math(ctx)
    a, b = m.wrap(ctx.inputs[0]), m.wrap(ctx.inputs[1])
    both = m.apply("Min", a, b)
    return m.where(m.isnan(a), b, m.where(m.isnan(b), a, both)).tensor


class _Copysign(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        b = torch.where(b.abs() < 0.3, torch.zeros_like(b), b)  # zeros among the signs (-0.0: the test module)
        return torch.copysign(a, b)


@converter_case(lambda: _Copysign(), inputs=[((5, 8), "float32"), ((5, 8), "float32")])
def convert_signbit(ctx: ConverterContext) -> gs.Tensor:
    """``prims::signbit`` (``copysign`` decomposes to it): negative, or a negative zero (``1/x == -inf``).

    The prim's meta gives its output the input's dtype (the decomposition casts it to bool after): 0 or 1."""
    m = _math(ctx)
    x = m.wrap(ctx.inputs[0])
    negative = x < 0
    if m.dtype.kind == "f":
        negative = negative | (x.eq(0.0) & ((1.0 / x) < 0.0))
    want = ctx.node.outputs[0].dtype
    if want is None or np.dtype(want) == np.bool_:
        return negative.tensor
    return ctx.op.Cast(negative.tensor, to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(want)))


class _Cumprod(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, self.dim) + torch.prod(x)


@converter_case(lambda: _Cumprod(1), inputs=[((3, 6, 2), "float32")])
@converter_case(lambda: _Cumprod(0), inputs=[((5, 4), "float32")], dynamic={"x": {1: ("n", 1, 4, 8)}})
def convert_prod(ctx: ConverterContext) -> gs.Tensor:
    """``prims::prod(inp, dims)``: ``ReduceProd`` over ``dims`` (all axes when None), ``cumprod``'s lowering."""
    dims = ctx.attrs.get("dims")
    x = ctx.inputs[0]
    out_type = ctx.attrs.get("output_dtype")
    if out_type is not None:
        x = ctx.op.Cast(x, to=int(out_type))
    if dims is None:
        return ctx.op.ReduceProd(x, keepdims=0)
    if len(dims) == 0:
        return ctx.op.Identity(x)
    return ctx.op.ReduceProd(x, ctx.constant(np.array(dims, np.int64)), keepdims=0)


class _Hypot(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.hypot(a * 1e20, b * 1e20) * 1e-20 + torch.hypot(a, torch.zeros_like(a))


@converter_case(lambda: _Hypot(), inputs=[((4, 9), "float32"), ((4, 9), "float32")])
def convert_hypot(ctx: ConverterContext) -> gs.Tensor:
    """``prims::hypot``: ``big * sqrt(1 + (small/big)^2)``, which neither overflows nor underflows where
    ``sqrt(a^2 + b^2)`` would; 0 where both are 0, inf where either is infinite (as ``std::hypot``)."""
    m = _math(ctx)
    a, b = m.wrap(ctx.inputs[0]).abs(), m.wrap(ctx.inputs[1]).abs()
    big, small = m.apply("Max", a, b), m.apply("Min", a, b)
    ratio = small / m.where(big.eq(0.0), 1.0, big)
    value = big * m.sqrt(1.0 + ratio * ratio)
    infinite = m.apply("IsInf", a) | m.apply("IsInf", b)
    return m.where(infinite, float("inf"), value).tensor


class _Uniform(torch.nn.Module):
    """Whether every draw lies in [low, high): deterministic, whatever the generator."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = torch.empty(4, 100, dtype=x.dtype).uniform_(-2.0, 3.0)
        return x + ((u >= -2.0) & (u < 3.0)).to(x.dtype)


class _Normal(torch.nn.Module):
    """Whether every draw lies within 10 standard deviations (UnivNet's noise: ``torch.randn(..., generator=None)``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.randn((4, 100), generator=None, dtype=x.dtype)
        return x + (z.abs() < 10.0).to(x.dtype)


def _static_shape(node: gs.Node, settings: object) -> bool:
    return all(isinstance(d, int) for d in node.attrs.get("shape", []))


@converter_case(lambda: _Uniform(), inputs=[((4, 100), "float32")])
def convert_uniform(ctx: ConverterContext) -> gs.Tensor:
    """``prims::uniform(shape, low, high, dtype)``: ``RandomUniform`` (TensorRT ignores the seed, as PyTorch's
    generator state cannot travel into the graph: the values differ from PyTorch's, their distribution does not)."""
    dtype = ctx.attrs.get("dtype")
    to = int(dtype) if isinstance(dtype, int) and dtype in onnx.TensorProto.DataType.values() else 1
    return ctx.op.RandomUniform(
        shape=[int(d) for d in ctx.attrs["shape"]],
        low=float(ctx.attrs["low"]),
        high=float(ctx.attrs["high"]),
        dtype=to,
    )


def _static_size_no_generator(node: gs.Node, settings: object) -> bool:
    return node.attrs.get("generator") is None and all(isinstance(d, int) for d in node.attrs.get("size", []))


@converter_case(lambda: _Normal(), inputs=[((4, 100), "float32")])
def convert_randn_generator(ctx: ConverterContext) -> gs.Tensor:
    """``aten::randn.generator(size, generator=None, dtype)``, the overload a ``generator=`` argument picks even
    when it is None (UnivNet's noise): ``RandomNormal``, as the plain overload; its values differ from PyTorch's,
    their distribution does not (validation judges such outputs by distribution). A real generator's state cannot
    travel into the graph: the validator leaves that call to the exporter's error."""
    dtype = ctx.attrs.get("dtype")
    to = int(dtype) if isinstance(dtype, int) and dtype in onnx.TensorProto.DataType.values() else 1
    return ctx.op.RandomNormal(shape=[int(d) for d in ctx.attrs["size"]], mean=0.0, scale=1.0, dtype=to)


def _scaled(m: Math, a: Any, exponent: Any) -> Any:
    """``a / 2^exponent``, exact: by two powers of two (neither overflows where one would)."""
    half = m.floor(exponent * 0.5)
    return a / m.apply("Pow", 2.0, half) / m.apply("Pow", 2.0, exponent - half)


def _binary_exponent(m: Math, a: Any) -> Any:
    """``e`` with ``0.5 <= a / 2^e < 1`` for a positive finite ``a`` (as a float): ``floor(log2 a) + 1``, moved
    by one where the logarithm rounded across a power of two."""
    guess = m.floor(m.log(a) * (1.0 / np.log(2.0))) + 1.0
    guess = m.where(_scaled(m, a, guess) >= 1.0, guess + 1.0, guess)
    return m.where(_scaled(m, a, guess) < 0.5, guess - 1.0, guess)


class _Frexp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = torch.cat([x * 1e-30, x, x * 1e30, torch.tensor([0.0, 0.5, 1.0, -2.0, 3e38, 1e-38])])
        mantissa, exponent = torch.frexp(scaled)
        return mantissa, exponent


@converter_case(lambda: _Frexp(), inputs=[((40,), "float32")])
def convert_frexp(ctx: ConverterContext) -> list[gs.Tensor]:
    """``prims::frexp``: ``x = mantissa * 2^exponent`` with ``0.5 <= |mantissa| < 1`` (0 for 0; infinities and
    NaN keep their value, exponent 0). The exponent comes from ``log2``, corrected by one either way where the
    logarithm rounds across a power of two; the division by ``2^exponent`` (in two halves, so neither overflows)
    is exact."""
    m = _math(ctx)
    x = m.wrap(ctx.inputs[0])
    finite = ~(m.isnan(x) | m.apply("IsInf", x)) & ~x.eq(0.0)
    safe = m.where(finite, x.abs(), 1.0)
    exponent = _binary_exponent(m, safe)
    mantissa = m.where(finite, m.where(x < 0.0, -_scaled(m, safe, exponent), _scaled(m, safe, exponent)), x)
    exponent = m.where(finite, exponent, 0.0)
    return [mantissa.tensor, ctx.op.Cast(exponent.tensor, to=onnx.TensorProto.INT32)]


class _Nextafter(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = torch.cat([a, a * 1e30, torch.tensor([1.0, 1.0, -0.5, 2.0, 3e38, 1.0, float("inf")])])
        b = torch.cat([b, b, torch.tensor([1.0, 0.0, -1.0, 5.0, float("inf"), 1.0, 0.0])])
        return torch.nextafter(a, b)


@converter_case(lambda: _Nextafter(), inputs=[((20,), "float32"), ((20,), "float32")])
def convert_nextafter(ctx: ConverterContext) -> gs.Tensor:
    """``prims::nextafter(x, y)``: the next representable value after ``x`` toward ``y``: ``x +- ulp``, the ulp
    being ``2^(e - digits)`` from ``x``'s binary exponent (half that stepping toward zero from a power of two;
    the smallest subnormal below the normal range and from 0); +-max from +-inf; ``y`` where they are equal, NaN
    where either is."""
    m = _math(ctx)
    x, y = m.wrap(ctx.inputs[0]), m.wrap(ctx.inputs[1])
    digits, lowest = (53.0, -1074.0) if m.dtype == np.float64 else (24.0, -149.0)
    a = x.abs()
    safe = m.where(a.eq(0.0) | m.apply("IsInf", x), 1.0, a)
    exponent = _binary_exponent(m, safe)
    toward_zero = (y > x).eq(x < 0.0) & ~a.eq(0.0)
    power_of_two = _scaled(m, safe, exponent).eq(0.5)
    step = exponent - digits - m.where(toward_zero & power_of_two, 1.0, 0.0)
    ulp = m.apply("Pow", 2.0, m.where(a.eq(0.0), lowest, m.apply("Max", step, lowest)))
    moved = m.where(y > x, x + ulp, x - ulp)
    largest = float(np.finfo(m.dtype).max)
    moved = m.where(m.apply("IsInf", x), m.where(x > 0.0, largest, -largest), moved)
    undefined = m.isnan(x) | m.isnan(y)
    return m.where(undefined, float("nan"), m.where(x.eq(y), y, moved)).tensor


def register_aten1_converters(registry: ConverterRegistry) -> None:
    """Register every pointwise and numeric ATen/prims converter on ``registry``."""
    registry.register("prims::fmax")(convert_fmax)
    registry.register("prims::fmin")(convert_fmin)
    registry.register("prims::signbit")(convert_signbit)
    registry.register("prims::prod")(convert_prod)
    registry.register("prims::hypot")(convert_hypot)
    registry.register("prims::frexp")(convert_frexp)
    registry.register("prims::nextafter")(convert_nextafter)
    registry.register("prims::uniform", validator=_static_shape, supports_dynamic_shapes=False)(convert_uniform)
    registry.register("aten::randn.generator", validator=_static_size_no_generator, supports_dynamic_shapes=False)(
        convert_randn_generator
    )
    register_special_converters(registry)
    register_gamma_converters(registry)
    register_order_stat_converters(registry)
    register_polynomial_converters(registry)
