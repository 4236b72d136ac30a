"""Arithmetic on graph tensors for converters that port a numeric kernel (PyTorch's ``ATen/native/Math.h``).

``Math(ctx, dtype)`` wraps graph tensors as :class:`Expr`, whose Python operators build ONNX nodes, so a Cephes
polynomial or a piecewise formula reads like the C++ it reproduces:

>>> m = Math(ctx, np.float32)                                    # doctest: +SKIP
>>> x = m.wrap(ctx.inputs[0])
>>> y = m.where(x.abs() <= 8.0, m.exp(x) * m.chbevl(x / 2.0 - 2.0, A), m.sqrt(x))

Numbers become constants of ``dtype``. A piecewise formula computes every branch and selects with ``Where``:
values of an untaken branch (an overflow, a NaN) never reach the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from converters.context import ConverterContext

Operand = Any  # an Expr, a gs.Tensor or a Python number


class Expr:
    """A graph tensor with arithmetic and comparison operators that add ONNX nodes through ``math``."""

    def __init__(self, math: Math, tensor: gs.Tensor) -> None:
        self.math = math
        self.tensor = tensor

    def _binary(self, op: str, other: Operand, reverse: bool = False) -> Expr:
        a, b = self.tensor, self.math.tensor(other)
        return self.math.apply(op, b, a) if reverse else self.math.apply(op, a, b)

    def __add__(self, other: Operand) -> Expr:
        return self._binary("Add", other)

    def __radd__(self, other: Operand) -> Expr:
        return self._binary("Add", other, reverse=True)

    def __sub__(self, other: Operand) -> Expr:
        return self._binary("Sub", other)

    def __rsub__(self, other: Operand) -> Expr:
        return self._binary("Sub", other, reverse=True)

    def __mul__(self, other: Operand) -> Expr:
        return self._binary("Mul", other)

    def __rmul__(self, other: Operand) -> Expr:
        return self._binary("Mul", other, reverse=True)

    def __truediv__(self, other: Operand) -> Expr:
        return self._binary("Div", other)

    def __rtruediv__(self, other: Operand) -> Expr:
        return self._binary("Div", other, reverse=True)

    def __pow__(self, other: Operand) -> Expr:
        return self._binary("Pow", other)

    def __neg__(self) -> Expr:
        return self.math.apply("Neg", self.tensor)

    def __lt__(self, other: Operand) -> Expr:
        return self._binary("Less", other)

    def __le__(self, other: Operand) -> Expr:
        return self._binary("LessOrEqual", other)

    def __gt__(self, other: Operand) -> Expr:
        return self._binary("Greater", other)

    def __ge__(self, other: Operand) -> Expr:
        return self._binary("GreaterOrEqual", other)

    def eq(self, other: Operand) -> Expr:
        """Elementwise ``==`` (a bool tensor; ``__eq__`` stays identity so Exprs can sit in sets)."""
        return self._binary("Equal", other)

    def __and__(self, other: Operand) -> Expr:
        return self._binary("And", other)

    def __or__(self, other: Operand) -> Expr:
        return self._binary("Or", other)

    def __invert__(self) -> Expr:
        return self.math.apply("Not", self.tensor)

    def abs(self) -> Expr:
        """``|x|``."""
        return self.math.apply("Abs", self.tensor)


class Math:
    """Builds :class:`Expr` arithmetic in ``ctx``'s graph; numbers become constants of ``dtype``."""

    def __init__(self, ctx: ConverterContext, dtype: Any = np.float32) -> None:
        self.ctx = ctx
        self.dtype = np.dtype(dtype)

    def wrap(self, tensor: gs.Tensor) -> Expr:
        """A graph tensor as an :class:`Expr`."""
        return Expr(self, tensor)

    def const(self, value: float) -> Expr:
        """A scalar constant of the math's dtype."""
        return Expr(self, self.ctx.constant(np.array(value, self.dtype)))

    def tensor(self, value: Operand) -> gs.Tensor:
        """The graph tensor behind ``value`` (numbers become constants of the math's dtype)."""
        if isinstance(value, Expr):
            return value.tensor
        if isinstance(value, gs.Tensor):
            return value
        return self.ctx.constant(np.array(value, self.dtype))

    def apply(self, op_type: str, *inputs: Operand, **attrs: Any) -> Expr:
        """One ONNX node ``op_type`` over ``inputs``, as an Expr."""
        return Expr(self, getattr(self.ctx.op, op_type)(*(self.tensor(i) for i in inputs), **attrs))

    def where(self, condition: Operand, then: Operand, otherwise: Operand) -> Expr:
        """``condition ? then : otherwise`` elementwise."""
        return self.apply("Where", condition, then, otherwise)

    def exp(self, x: Operand) -> Expr:
        """``e^x``."""
        return self.apply("Exp", x)

    def log(self, x: Operand) -> Expr:
        """Natural logarithm."""
        return self.apply("Log", x)

    def sqrt(self, x: Operand) -> Expr:
        """Square root."""
        return self.apply("Sqrt", x)

    def sin(self, x: Operand) -> Expr:
        """Sine."""
        return self.apply("Sin", x)

    def cos(self, x: Operand) -> Expr:
        """Cosine."""
        return self.apply("Cos", x)

    def floor(self, x: Operand) -> Expr:
        """Round toward minus infinity."""
        return self.apply("Floor", x)

    def isnan(self, x: Operand) -> Expr:
        """A bool tensor: where ``x`` is NaN."""
        return self.apply("IsNaN", x)

    def cast(self, x: Operand, onnx_type: int) -> Expr:
        """``x`` cast to the ONNX element type ``onnx_type``."""
        return self.apply("Cast", x, to=onnx_type)

    def polevl(self, x: Operand, coefficients: Sequence[float]) -> Expr:
        """Cephes ``polevl``: ``c[0] x^n + ... + c[n]`` by Horner's rule."""
        result: Operand = self.const(coefficients[0])
        for c in coefficients[1:]:
            result = self.wrap(self.tensor(result)) * x + c
        return self.wrap(self.tensor(result))

    def p1evl(self, x: Operand, coefficients: Sequence[float]) -> Expr:
        """Cephes ``p1evl``: ``polevl`` with an implied leading coefficient 1."""
        return self.polevl(x, [1.0, *coefficients])

    def chbevl(self, x: Operand, coefficients: Sequence[float]) -> Expr:
        """Cephes ``chbevl``: the Chebyshev series ``sum c[i] T_i(x/2)`` by Clenshaw's recurrence, in the order
        ``Math.h`` runs it (``0.5 * (b0 - b2)``)."""
        b0: Operand = self.const(coefficients[0])
        b1: Operand = 0.0
        b2: Operand = 0.0
        xe = self.wrap(self.tensor(x))
        for c in coefficients[1:]:
            b2 = b1
            b1 = b0
            b0 = xe * b1 - b2 + c
        return (self.wrap(self.tensor(b0)) - b2) * 0.5
