"""A plugin's output dtypes and shapes from its torch op's fake (meta) kernel, symbolic in the dynamic input dims.

TensorRT asks a plugin for its outputs with the input dims as expressions, some of them build-time constants.
:func:`fake_outputs` runs the op's fake kernel with those constants, and a symbol (``torch.SymInt``) for every
other dim, and returns each output size as an int or a sympy expression over those symbols; :func:`evaluate`
turns such an expression into the caller's own arithmetic (``tensorrt.plugin`` shape expressions, or ints).

Symbols get one shared hint (:data:`HINT`) and no duck sizing: two dims are the same symbol only when the kernel
says so (``torch._check(a == b)``), and a guard the kernel evaluates on a dynamic dim sees the hint.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.utils._sympy.functions as symfn

from converters.errors import ConversionError
from converters.plugins.spec import PluginSpec

#: The value a dynamic dim is assumed to have where the fake kernel evaluates a guard (not 0 or 1: torch
#: specialises those).
HINT = 16

Symbols = dict[sympy.Symbol, tuple[int, int]]  # symbol -> (input index, axis)


@dataclass(frozen=True)
class FakeOutput:
    """One output of the op's fake kernel: its dtype and sizes (ints, or expressions of the dynamic input dims)."""

    dtype: torch.dtype
    sizes: tuple[int | sympy.Expr, ...]


def fake_outputs(
    spec: PluginSpec,
    dtypes: Sequence[torch.dtype],
    dims: Sequence[Sequence[int | None]],
    attrs: Mapping[str, Any],
) -> tuple[list[FakeOutput], Symbols]:
    """Run ``spec``'s fake kernel on inputs of ``dtypes`` whose dims are ints (known) or None (dynamic)."""
    from torch._dynamo.source import LocalSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv(duck_shape=False)
    symbols: Symbols = {}

    def size(index: int, axis: int, known: int | None) -> int | torch.SymInt:
        if known is not None:
            return known
        source = LocalSource(f"{spec.name}_input{index}_dim{axis}")
        symbol = env.create_symbol(HINT, source=source, dynamic_dim=DimDynamic.DYNAMIC)
        symbols[symbol] = (index, axis)
        return env.create_symintnode(symbol, hint=HINT, source=source)

    try:
        with FakeTensorMode(shape_env=env):
            inputs = [
                torch.empty([size(i, a, d) for a, d in enumerate(shape)], dtype=dtype)
                for i, (dtype, shape) in enumerate(zip(dtypes, dims, strict=True))
            ]
            results = spec.call(inputs, attrs)
    except Exception as exc:
        raise ConversionError(
            f"the fake kernel of {spec.torch_op} failed on inputs {[tuple(d) for d in dims]} "
            f"(None = dynamic): {type(exc).__name__}: {exc}",
            fix="register a fake kernel (@op.register_fake) that works for symbolic sizes",
        ) from exc
    outputs = [FakeOutput(r.dtype, tuple(_size_expr(s) for s in r.shape)) for r in results]
    _check_symbols(spec, outputs, symbols, env)
    return outputs, symbols


def _size_expr(size: int | torch.SymInt) -> int | sympy.Expr:
    if isinstance(size, torch.SymInt):
        expr = size.node.expr
        return int(expr) if expr.is_Integer else expr
    return int(size)


def _check_symbols(spec: PluginSpec, outputs: list[FakeOutput], symbols: Symbols, env: Any) -> None:
    """Output sizes may only depend on input dims: not on data (unbacked sizes), nor on a dynamic dim the fake
    kernel pinned to the hint."""
    pinned = [s for s in symbols if isinstance(env.replacements.get(s), sympy.Integer)]
    free = {f for o in outputs for s in o.sizes if isinstance(s, sympy.Expr) for f in s.free_symbols}
    unknown = free - set(symbols)
    if pinned or unknown:
        raise ConversionError(
            f"plugin {spec.plugin_id}: "
            + (f"output sizes depend on data ({', '.join(map(str, unknown))})" if unknown else "")
            + ("; " if pinned and unknown else "")
            + (f"the fake kernel fixes dynamic dims to {HINT}" if pinned else ""),
            fix="plugins from register_plugin need output sizes computed from input sizes and attributes; keep "
            "the op's dims static, or write the plugin by hand (tensorrt.plugin size tensors)",
        )


@dataclass(frozen=True)
class Algebra:
    """How to build sizes in the caller's world: constants, and the operations Python operators do not cover.
    ``+ - * //`` are used on the values themselves, which must keep a non-constant operand on the left
    (``tensorrt.plugin`` shape expressions have no reflected operators)."""

    constant: Callable[[int], Any]
    max: Callable[[Any, Any], Any]
    min: Callable[[Any, Any], Any]
    cdiv: Callable[[Any, Any], Any]


INTEGERS = Algebra(constant=int, max=builtins.max, min=builtins.min, cdiv=lambda a, b: -(-a // b))


def evaluate(expr: int | sympy.Expr, values: Mapping[sympy.Symbol, Any], algebra: Algebra) -> Any:
    """``expr`` (a size from :func:`fake_outputs`) computed from ``values`` (one per symbol) with ``algebra``."""
    if isinstance(expr, int) or expr.is_Integer:
        return algebra.constant(int(expr))
    if expr.is_Symbol:
        return values[expr]
    if isinstance(expr, sympy.Add):
        return _add(expr, values, algebra)
    args = [evaluate(a, values, algebra) for a in expr.args]
    if isinstance(expr, sympy.Mul):
        return _fold(lambda a, b: a * b, args)
    if isinstance(expr, symfn.FloorDiv):
        return args[0] // args[1]
    if isinstance(expr, symfn.CeilDiv):
        return algebra.cdiv(args[0], args[1])
    if isinstance(expr, symfn.Mod | symfn.PythonMod):
        return args[0] - (args[0] // args[1]) * args[1]
    if isinstance(expr, symfn.Max | sympy.Max):
        return _fold(algebra.max, args)
    if isinstance(expr, symfn.Min | sympy.Min):
        return _fold(algebra.min, args)
    if isinstance(expr, sympy.Pow | symfn.PowByNatural) and expr.args[1].is_Integer and int(expr.args[1]) > 0:
        return _fold(lambda a, b: a * b, [args[0]] * int(expr.args[1]))
    if isinstance(expr, symfn.Identity):
        return args[0]
    raise ConversionError(
        f"cannot express the plugin output size {expr} as a TensorRT shape expression",
        fix="compute output sizes with +, -, *, //, ceil division, min and max of input sizes in the fake kernel",
    )


def _add(expr: sympy.Add, values: Mapping[sympy.Symbol, Any], algebra: Algebra) -> Any:
    """Positive terms summed first, then negative ones subtracted: ``s1 - s0`` rather than ``s1 + (-1) * s0``."""
    positive: list[Any] = []
    negative: list[Any] = []
    for term in sorted(expr.args, key=lambda t: t.is_number):  # symbolic terms first: they go on the left
        coefficient, _ = term.as_coeff_Mul()
        if coefficient < 0:
            negative.append(evaluate(-term, values, algebra))
        else:
            positive.append(evaluate(term, values, algebra))
    total = _fold(lambda a, b: a + b, positive) if positive else algebra.constant(0)
    for term in negative:
        total = total - term
    return total


def _fold(function: Callable[[Any, Any], Any], args: Sequence[Any]) -> Any:
    # sympy puts numbers first (2*s0); a constant on the left would need reflected operators, so put it last
    ordered = sorted(args, key=lambda a: isinstance(a, int))
    result = ordered[0]
    for arg in ordered[1:]:
        result = function(result, arg)
    return result
