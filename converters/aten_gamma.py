"""The gamma family and ``erfinv``: ``lgamma``, ``digamma``, ``polygamma``, Hurwitz ``zeta``, ``erf_inv``.

``digamma``, ``trigamma``, ``zeta`` and ``erfinv`` follow PyTorch's kernels (``ATen/native/Math.h``) step for
step; their data-dependent ``while`` loops become a fixed number of guarded steps (a step that PyTorch would not
take adds nothing). ``lgamma`` (libm's ``lgammaf`` in PyTorch) is Stirling's series at ``z + 8`` brought back by
``log(z (z+1) ... (z+7))``, with the reflection formula below 0.5: within 1e-6 absolute of ``lgammaf``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_graphsurgeon as gs
import torch

from converters.cases import converter_case
from converters.context import ConverterContext
from converters.math_builder import Expr, Math
from converters.registry import ConverterRegistry

INF = float("inf")
NAN = float("nan")
_HALF_LOG_2PI = 0.91893853320467274178


def _is_integer(m: Math, x: Expr) -> Expr:
    return x.eq(m.floor(x))


def lgamma(m: Math, x: Expr) -> Expr:
    """``log|Gamma(x)|``; +inf at 0 and the negative integers."""
    reflect = x < 0.5
    z = m.where(reflect, 1.0 - x, x)
    shifted = m.where(z < 8.0, z + 8.0, z)
    inverse = 1.0 / shifted
    i2 = inverse * inverse
    series = inverse * (1.0 / 12.0 - i2 * (1.0 / 360.0 - i2 * (1.0 / 1260.0 - i2 * (1.0 / 1680.0))))
    stirling = (shifted - 0.5) * m.log(shifted) - shifted + _HALF_LOG_2PI + series
    product = z * (z + 1.0) * (z + 2.0) * (z + 3.0) * (z + 4.0) * (z + 5.0) * (z + 6.0) * (z + 7.0)
    positive = m.where(z < 8.0, stirling - m.log(product), stirling)
    fraction = x - m.floor(x)
    reflected = m.log(math.pi / m.apply("Abs", m.sin(fraction * math.pi))) - positive
    value = m.where(reflect, reflected, positive)
    pole = (x <= 0.0) & _is_integer(m, x)
    return m.where(pole, INF, m.where(m.apply("IsInf", x), INF, value))


def _digamma_positive(m: Math, x: Expr) -> Expr:
    """``calc_digamma`` for ``x > 0``: up to 10 recurrence steps to reach 10, then the asymptotic series."""
    result: Expr = m.const(0.0)
    for _ in range(10):
        below = x < 10.0
        result = result - m.where(below, 1.0 / x, 0.0)
        x = x + m.where(below, 1.0, 0.0)
    z = 1.0 / (x * x)
    coefficients = [
        8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
        -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
        8.33333333333333333333e-2,
    ]  # fmt: skip
    y = m.where(x < 1.0e17, z * m.polevl(z, coefficients), 0.0)
    asymptotic = result + m.log(x) - 0.5 / x - y
    return m.where(x.eq(10.0), result + 2.25175258906672110764, asymptotic)


def digamma(m: Math, x: Expr) -> Expr:
    """``calc_digamma``: reflection below 0 (``- pi / tan(pi frac(x))``), NaN at negative integers, -+inf at +-0."""
    negative = x < 0.0
    value = _digamma_positive(m, m.where(negative, 1.0 - x, x))
    fraction = x - m.apply("Sign", x) * m.floor(x.abs())  # modf's fractional part, with x's sign
    reflected = value - math.pi / m.apply("Tan", fraction * math.pi)
    value = m.where(negative, m.where(_is_integer(m, x), NAN, reflected), value)
    signed_inf = m.where((1.0 / x) < 0.0, INF, -INF)  # copysign(inf, -x)
    return m.where(x.eq(0.0), signed_inf, value)


def trigamma(m: Math, x: Expr) -> Expr:
    """``trigamma`` (float): reflection below 0.5, six recurrence steps, the asymptotic series."""
    reflect = x < 0.5
    sine = m.sin(x * math.pi)
    result = m.where(reflect, -(math.pi * math.pi) / (sine * sine), 0.0)
    x = m.where(reflect, 1.0 - x, x)
    for _ in range(6):
        result = result + 1.0 / (x * x)
        x = x + 1.0
    ixx = 1.0 / (x * x)
    result = result + (1.0 + 1.0 / (2.0 * x) + ixx * (1.0 / 6.0 - ixx * (1.0 / 30.0 - ixx * (1.0 / 42.0)))) / x
    return m.where(reflect, -result, result)


_ZETA_A = (
    12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
    -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
    -7.1661652561756670113e18,
)  # fmt: skip
#: Direct-sum steps: PyTorch takes at least 9 and continues while ``q + i <= 9``; 29 covers every ``q > -20``.
_ZETA_STEPS = 29


def zeta(m: Math, x: Expr, q: Expr) -> Expr:
    """Hurwitz ``zeta(x, q)`` as ``Math.h``: a direct sum, then Euler-Maclaurin with 12 Bernoulli terms. For
    ``q <= -20`` (defined only for integer ``x``) more direct steps would be needed: NaN there, never a wrong number."""
    s = m.apply("Pow", q, -x)
    a = q
    b: Expr = m.const(0.0)
    for i in range(_ZETA_STEPS):
        take = a <= 9.0 if i >= 9 else None
        a_next = a + 1.0
        term = m.apply("Pow", a_next, -x)
        if take is None:
            a, b, s = a_next, term, s + term
        else:
            a, b, s = m.where(take, a_next, a), m.where(take, term, b), s + m.where(take, term, 0.0)
    w = a
    s = s + b * w / (x - 1.0) - 0.5 * b
    factor: Expr = m.const(1.0)
    k = 0.0
    for coefficient in _ZETA_A:
        factor = factor * (x + k)
        b = b / w
        s = s + factor * b / coefficient
        k += 1.0
        factor = factor * (x + k)
        b = b / w
        k += 1.0
    q_pole = (q <= 0.0) & _is_integer(m, q)
    undefined = (x < 1.0) | ((q <= 0.0) & ~_is_integer(m, x)) | (q <= -20.0)
    return m.where(x.eq(1.0), INF, m.where(q_pole, INF, m.where(undefined, NAN, s)))


def polygamma(m: Math, n: int, x: Expr) -> Expr:
    """``calc_polygamma``: digamma for n = 0, trigamma for 1, else ``(-1)^(n+1) n! zeta(n + 1, x)``."""
    if n == 0:
        return digamma(m, x)
    if n == 1:
        return trigamma(m, x)
    sign = 1.0 if n % 2 else -1.0
    return zeta(m, m.const(float(n + 1)), x) * (sign * math.factorial(n))


def erfinv(m: Math, y: Expr) -> Expr:
    """``calc_erfinv``: a rational first guess, two Newton steps on ``erf``; +-inf at +-1, NaN beyond."""
    a = (0.886226899, -1.645349621, 0.914624893, -0.140543331)
    b = (-2.118377725, 1.442710462, -0.329097515, 0.012229801)
    c = (-1.970840454, -1.624906493, 3.429567803, 1.641345311)
    d = (3.543889200, 1.637067800)
    y_abs = y.abs()
    z = y * y
    num = ((a[3] * z + a[2]) * z + a[1]) * z + a[0]
    dem = (((b[3] * z + b[2]) * z + b[1]) * z + b[0]) * z + 1.0
    central = y * num / dem
    t = m.sqrt(-m.log((1.0 - y_abs) / 2.0))
    num_tail = ((c[3] * t + c[2]) * t + c[1]) * t + c[0]
    dem_tail = (d[1] * t + d[0]) * t + 1.0
    tail = m.where(y < 0.0, -num_tail, num_tail) / dem_tail
    x = m.where(y_abs <= 0.7, central, tail)
    for _ in range(2):
        x = x - (m.apply("Erf", x) - y) / ((2.0 / math.sqrt(math.pi)) * m.exp(-x * x))
    edge = m.where(y < 0.0, -INF, INF)
    return m.where(y_abs > 1.0, NAN, m.where(y_abs.eq(1.0), edge, x))


def _float_math(ctx: ConverterContext) -> Math:
    dtype = next((d for d in ctx.input_dtypes if d is not None and d.kind == "f"), np.dtype(np.float32))
    return Math(ctx, dtype)


class _Function(torch.nn.Module):
    def __init__(self, function: Callable[..., torch.Tensor], scale: float, shift: float) -> None:
        super().__init__()
        self.function, self.scale, self.shift = function, scale, shift

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        x = inputs[-1] * self.scale + self.shift
        return self.function(*inputs[:-1], x)


@converter_case(lambda: _Function(torch.lgamma, 4.0, 0.3), inputs=[((6, 50), "float32")])
def convert_lgamma(ctx: ConverterContext) -> gs.Tensor:
    """``prims::lgamma`` (``lgamma``, ``mvlgamma``)."""
    m = _float_math(ctx)
    return lgamma(m, m.wrap(ctx.inputs[0])).tensor


@converter_case(lambda: _Function(torch.digamma, 4.0, 0.3), inputs=[((6, 50), "float32")])
def convert_digamma(ctx: ConverterContext) -> gs.Tensor:
    """``prims::digamma``."""
    m = _float_math(ctx)
    return digamma(m, m.wrap(ctx.inputs[0])).tensor


class _Polygamma(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.polygamma(self.n, x.abs() * 3.0 + 0.1)


@converter_case(lambda: _Polygamma(1), inputs=[((6, 20), "float32")], name="polygamma_1")
@converter_case(lambda: _Polygamma(3), inputs=[((6, 20), "float32")], name="polygamma_3")
def convert_polygamma(ctx: ConverterContext) -> gs.Tensor:
    """``aten::polygamma(n, self)``."""
    m = _float_math(ctx)
    return polygamma(m, int(ctx.attrs["n"]), m.wrap(ctx.inputs[0])).tensor


class _Zeta(torch.nn.Module):
    def forward(self, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return torch.special.zeta(x.abs() * 3.0 + 1.01, q.abs() * 4.0 + 0.05)


@converter_case(lambda: _Zeta(), inputs=[((5, 20), "float32"), ((5, 20), "float32")])
def convert_zeta(ctx: ConverterContext) -> gs.Tensor:
    """``prims::zeta(x, q)``: Hurwitz zeta."""
    m = _float_math(ctx)
    return zeta(m, m.wrap(ctx.inputs[0]), m.wrap(ctx.inputs[1])).tensor


class _Erfinv(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # erfinv's slope near +-1 turns one ulp of erf into 1e-4 at 0.9999: the case stops at 0.999
        return torch.erfinv(torch.tanh(x * 2.0) * 0.999)


@converter_case(lambda: _Erfinv(), inputs=[((6, 50), "float32")])
def convert_erf_inv(ctx: ConverterContext) -> gs.Tensor:
    """``prims::erf_inv``."""
    m = _float_math(ctx)
    return erfinv(m, m.wrap(ctx.inputs[0])).tensor


def register_gamma_converters(registry: ConverterRegistry) -> None:
    """lgamma, digamma, polygamma, zeta and erfinv."""
    registry.register("prims::lgamma")(convert_lgamma)
    registry.register("prims::digamma")(convert_digamma)
    registry.register("aten::polygamma.default")(convert_polygamma)
    registry.register("prims::zeta")(convert_zeta)
    registry.register("prims::erf_inv")(convert_erf_inv)
