"""``torch.special`` orthogonal polynomials (Chebyshev T/U/V/W and their shifted forms, Hermite H/He, Laguerre,
Legendre) with a tensor degree ``n``.

PyTorch evaluates each by its three-term recurrence up to ``n`` (``ATen/native/Math.h``); ``n`` is a tensor, so
the number of steps is data: the converter builds one ONNX ``Loop`` whose trip count is ``max(n) - 1``, carrying
``(P_{m-1}, P_m)`` and keeping ``P_m`` where ``trunc(n) == m``. Degrees below zero give 0, as in PyTorch; the
closed forms PyTorch takes for large ``n`` inside ``(-1, 1)`` (``cos(n acos x)``) agree with the recurrence to
float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.aten.numeric.math_builder import Expr, Math
from converters.cases import converter_case
from converters.context import ConverterContext
from converters.registry import ConverterRegistry

Step = Callable[[Expr, Expr, Expr, Expr], Expr]  # (x, P_m, P_{m-1}, m) -> P_{m+1}


@dataclass(frozen=True)
class Recurrence:
    """A polynomial family: its argument transform, ``P_1`` and the step ``P_{m+1} = step(x, P_m, P_{m-1}, m)``."""

    first: Callable[[Expr], Expr]
    step: Step
    argument: Callable[[Expr], Expr] = lambda x: x
    max_degree: int | None = None  # above it PyTorch returns NaN (the Hermite families in float32)


def _chebyshev(first: Callable[[Expr], Expr], shifted: bool = False) -> Recurrence:
    return Recurrence(
        first=first,
        step=lambda y, q, p, m: (y + y) * q - p,
        argument=(lambda x: x + x - 1.0) if shifted else (lambda x: x),
    )


FAMILIES: dict[str, Recurrence] = {
    "chebyshev_polynomial_t": _chebyshev(lambda y: y),
    "chebyshev_polynomial_u": _chebyshev(lambda y: y + y),
    "chebyshev_polynomial_v": _chebyshev(lambda y: y + y - 1.0),
    "chebyshev_polynomial_w": _chebyshev(lambda y: y + y + 1.0),
    "shifted_chebyshev_polynomial_t": _chebyshev(lambda y: y, shifted=True),
    "shifted_chebyshev_polynomial_u": _chebyshev(lambda y: y + y, shifted=True),
    "shifted_chebyshev_polynomial_v": _chebyshev(lambda y: y + y - 1.0, shifted=True),
    "shifted_chebyshev_polynomial_w": _chebyshev(lambda y: y + y + 1.0, shifted=True),
    "hermite_polynomial_h": Recurrence(
        first=lambda x: x + x, step=lambda x, q, p, m: (x + x) * q - (m + m) * p, max_degree=128
    ),
    "hermite_polynomial_he": Recurrence(first=lambda x: x, step=lambda x, q, p, m: x * q - m * p, max_degree=128),
    "laguerre_polynomial_l": Recurrence(
        first=lambda x: 1.0 - x, step=lambda x, q, p, m: ((m + m + (1.0 - x)) * q - m * p) / (m + 1.0)
    ),
    "legendre_polynomial_p": Recurrence(
        first=lambda x: x, step=lambda x, q, p, m: ((m + m + 1.0) * x * q - m * p) / (m + 1.0)
    ),
}


def _degree(m: Math, n: Expr, family: Recurrence) -> Expr:
    """``n`` truncated toward zero as PyTorch's ``static_cast<int64_t>``; NaN, infinite (and, for Hermite, too
    large) degrees become -1 (the result 0) or are flagged NaN below."""
    truncated = m.apply("Sign", n) * m.floor(n.abs())
    finite = ~(m.isnan(n) | m.apply("IsInf", n))
    return m.where(finite, truncated, -1.0)


def _loop(ctx: ConverterContext, m: Math, y: Expr, degree: Expr, family: Recurrence) -> Expr:
    """``P_degree(y)`` elementwise by a Loop of ``max(degree) - 1`` steps (zero steps when every degree <= 1)."""
    like = y + degree * 0.0  # the broadcast shape of x and n
    shape = ctx.op.Shape(like.tensor)
    one = m.wrap(ctx.op.Expand(m.tensor(1.0), shape))
    first = m.wrap(ctx.op.Expand(family.first(y).tensor, shape))
    initial = m.where(degree.eq(0.0), one, m.where(degree.eq(1.0), first, 0.0))
    flat = ctx.op.Reshape(degree.tensor, ctx.constant(np.array([-1], np.int64)))
    highest = ctx.op.ReduceMax(flat, ctx.constant(np.array([0], np.int64)), keepdims=0)
    trips = ctx.op.Cast(ctx.op.Max(ctx.op.Sub(highest, m.tensor(1.0)), m.tensor(0.0)), to=onnx.TensorProto.INT64)

    outer_nodes = len(ctx.graph.nodes)
    value_type = m.dtype
    iteration = gs.Variable(ctx.fresh_name("loop_iter"), dtype=np.int64, shape=[])
    condition = gs.Variable(ctx.fresh_name("loop_cond"), dtype=np.bool_)
    previous, current, result = (gs.Variable(ctx.fresh_name(f"loop_{s}"), dtype=value_type) for s in "pqr")
    order = m.wrap(ctx.op.Add(ctx.op.Cast(iteration, to=onnx.helper.np_dtype_to_tensor_dtype(m.dtype)), m.tensor(1.0)))
    following = family.step(y, m.wrap(current), m.wrap(previous), order)
    kept = m.where(degree.eq(order + 1.0), following, m.wrap(result))
    keep_going = ctx.op.Identity(condition)
    body_nodes = ctx.graph.nodes[outer_nodes:]
    del ctx.graph.nodes[outer_nodes:]
    body = gs.Graph(
        nodes=body_nodes,
        inputs=[iteration, condition, previous, current, result],
        outputs=[
            _typed(keep_going, np.dtype(np.bool_)),
            _typed(current, value_type),
            _typed(following.tensor, value_type),
            _typed(kept.tensor, value_type),
        ],
        name=ctx.fresh_name("recurrence"),
        opset=ctx.opset,
    )
    carried = (one.tensor, first.tensor, initial.tensor)
    outputs = ctx.op.Loop(trips, ctx.constant(np.array(True)), *carried, body=body, outputs=3)
    return m.wrap(outputs[2])


def _typed(tensor: gs.Tensor, dtype: np.dtype) -> gs.Tensor:
    """A Loop body output with its element type recorded (ONNX requires a subgraph's outputs typed)."""
    tensor.dtype = dtype
    return tensor


def convert_polynomial(ctx: ConverterContext) -> gs.Tensor:
    """``aten::special_<family>(x, n)`` (two tensors, or ``n`` a Scalar): ``P_n(x)`` by the family's recurrence
    in an ONNX ``Loop`` (see the module docstring)."""
    family = FAMILIES[ctx.key.op_type.split(".")[0].removeprefix("special_")]
    dtype = next((d for d in ctx.input_dtypes if d is not None and d.kind == "f"), np.dtype(np.float32))
    m = Math(ctx, dtype)
    x = m.wrap(ctx.inputs[0])
    n = m.const(float(ctx.attrs["n"])) if ctx.attrs.get("n") is not None else m.wrap(ctx.inputs[1])
    to = onnx.helper.np_dtype_to_tensor_dtype(m.dtype)
    n = n if n.tensor.dtype is not None and np.dtype(n.tensor.dtype) == m.dtype else m.cast(n, to)
    x = x if x.tensor.dtype is not None and np.dtype(x.tensor.dtype) == m.dtype else m.cast(x, to)
    degree = _degree(m, n, family)
    result = _loop(ctx, m, family.argument(x), degree, family)
    if family.max_degree is not None:
        result = m.where(degree > float(family.max_degree), float("nan"), result)
    return result.tensor


class _Polynomial(torch.nn.Module):
    """``P_n(x)`` with a tensor degree (0..7 and below zero, whatever the random input) or a fixed one."""

    def __init__(self, name: str, degree: int | None = None) -> None:
        super().__init__()
        self.function = getattr(torch.special, name)
        self.degree = degree

    def forward(self, x: torch.Tensor, n: torch.Tensor | None = None) -> torch.Tensor:
        if self.degree is not None:
            return self.function(x, self.degree)
        assert n is not None
        return self.function(x, torch.floor(n * 3.0))


def polynomial_converter(name: str, overload: str) -> Callable[[ConverterContext], gs.Tensor]:
    """A converter (its own function, with its own test case) for ``special_<name>.<overload>``."""

    def convert(ctx: ConverterContext) -> gs.Tensor:
        return convert_polynomial(ctx)

    convert.__name__ = convert.__qualname__ = f"convert_{name}_{overload}"
    convert.__doc__ = convert_polynomial.__doc__
    if overload == "n_scalar":
        return converter_case(lambda: _Polynomial(name, 5), inputs=[((3, 4), "float32")], name=f"{name}_n5")(convert)
    dynamic = {"x": {0: ("batch", 1, 2, 4)}, "n": {0: ("batch", 1, 2, 4)}}
    return converter_case(
        lambda: _Polynomial(name),
        inputs=[((2, 5), "float32"), ((2, 5), "float32")],
        dynamic=dynamic if name == "legendre_polynomial_p" else None,
        name=name,
    )(convert)


def register_polynomial_converters(registry: ConverterRegistry) -> None:
    """Every family, for its tensor-tensor overload and its Scalar-n overload."""
    for name in FAMILIES:
        for overload in ("default", "n_scalar"):
            registry.register(f"aten::special_{name}.{overload}")(polynomial_converter(name, overload))
