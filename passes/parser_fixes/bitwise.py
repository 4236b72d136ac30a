"""BitShift and BitwiseAnd/Or/Xor/Not with a constant operand, as exact integer arithmetic (Mod, Div, Mul, Add, Sub).

TensorRT's parser rejects these ops and supports integers only as INT32/INT64 (UINT8 only at graph inputs and
outputs, through Cast), so the rewrite computes on an INT32/INT64 tensor holding the N-bit value of the operand:

- ``int32``, ``int64``: the tensor itself, as its two's-complement value (Bitwise*; BitShift is signed only from
  opset 28, where its right shift is arithmetic).
- ``uint32``, ``uint64`` produced by ``Cast`` from ``int32``/``int64`` of the same width (what the exporter writes for
  ``x << s`` and ``x >> s`` on int tensors): the Cast's input, holding the same bits as a signed value (the ONNX
  Cast spec keeps the low bits and reinterprets). The result is cast back to the unsigned type, and a following
  ``Cast`` to the signed type then reads the signed result directly (it becomes an Identity).
- ``uint8``: Cast to int32 (exact), computed on the unsigned value, cast back.

Left, because no rewrite makes them acceptable (the parser supports no tensor of that type): int8, int16, uint16,
and uint32/uint64 not produced by such a Cast. Also left: a non-constant shift or mask, one with several distinct
values, one that broadcasts the other operand to a larger shape, and shifts outside ``[0, N)``.

Exactness: every intermediate value is an integer in range (no overflow is relied on). ``Mod`` is ``fmod=0``
(floor, non-negative for the positive powers of two used here), so ``low(x, k) = Mod(x, 2**k)`` are the low k bits
of x for signed and unsigned x alike, and ``x - low(x, k)`` is x with them cleared. And with a mask is the sum of
its runs of ones ``low(x, b) - low(x, a)``; Or is ``(x - And) + c``; Xor is ``(x - And) + (c - And)``; Not is
``all_ones - x``. Right shift: ``floor(x / 2**s) = (x - low(x, s)) / 2**s`` (an exact Div), plus ``2**(N-s)`` for
a negative x when the shift is logical (an unsigned type held as signed). Left shift: ``low(x, N-s) * 2**s`` for an
unsigned value; for a signed one ``low(x, N-s-1) * 2**s`` plus ``INT_MIN`` times bit N-s-1 (the bit that lands on
the sign). Where ``2**(N-1)`` does not fit (the top bit of a full-width signed value), the low N-1 bits are
``x - [x < 0] * INT_MIN``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import PassResult
from passes.parser_fixes.values import ValueResolver, dtype_of, rank_of
from passes.rules import Facts, RewriteContext, RewriteRule

_SIGNED = {np.dtype(np.int32), np.dtype(np.int64)}
_UNSIGNED_OF = {np.dtype(np.int32): np.dtype(np.uint32), np.dtype(np.int64): np.dtype(np.uint64)}


@dataclass(frozen=True)
class BitDomain:
    """How the N-bit operand is held: ``value`` (a ``compute``-typed tensor, or None for the node's input cast to
    it) is the operand's signed or unsigned value; the result goes back to ``out_dtype``."""

    bits: int
    signed: bool
    compute: np.dtype
    value: gs.Tensor | None
    out_dtype: np.dtype


@dataclass(frozen=True)
class BitPlan:
    """What a bit op becomes: the op, the shift direction, the integer domain and the non-constant operand."""

    op: str
    direction: str  # BitShift only
    domain: BitDomain
    operand: gs.Tensor  # the non-constant input
    constant: int  # the shift, or the mask as an N-bit pattern (0 <= constant < 2**N); 0 for BitwiseNot


class BitwiseToArithmetic(RewriteRule[BitPlan]):
    """``x << s``, ``x >> s``, ``x & c``, ``x | c``, ``x ^ c``, ``~x`` as INT32/INT64 arithmetic (see module doc)."""

    name = "bitwise_to_arithmetic"
    ops = frozenset({"BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"})

    def check(self, node: gs.Node, facts: Facts) -> BitPlan | str:
        """A plan when one operand is a constant (or the op is BitwiseNot) on an integer type; else the reason."""
        if node.op == "BitwiseNot":
            operand, constant = node.inputs[0], np.zeros((), np.int64)
        else:
            found = _constant_operand(node, ValueResolver(facts.opset))
            if isinstance(found, str):
                return found
            operand, constant = found
        domain = _domain(operand)
        if isinstance(domain, str):
            return domain
        value = int(constant.reshape(-1)[0])
        if node.op == "BitShift":
            if not 0 <= value < domain.bits:
                return f"shift {value} outside [0, {domain.bits})"
        else:
            value %= 1 << domain.bits  # the mask's N-bit pattern, whatever its signedness
        return BitPlan(node.op, str(node.attrs.get("direction", "")), domain, operand, value)

    def rewrite(self, plan: BitPlan, ctx: RewriteContext) -> list[gs.Tensor]:
        """The bit op as exact integer arithmetic (Mod, Div, Mul, Add, Sub) in the plan's domain."""
        dom = plan.domain
        x = dom.value if dom.value is not None else _cast(ctx, plan.operand, dom.compute)
        arith = _Arithmetic(ctx, dom, x)
        if plan.op == "BitShift":
            y = arith.shift_left(plan.constant) if plan.direction == "LEFT" else arith.shift_right(plan.constant)
        elif plan.op == "BitwiseNot":
            y = arith.not_()
        else:
            y = {"BitwiseAnd": arith.and_, "BitwiseOr": arith.or_, "BitwiseXor": arith.xor}[plan.op](plan.constant)
        return [y if dom.out_dtype == dom.compute else _cast(ctx, y, dom.out_dtype)]

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        result = super().__call__(graph, settings)
        if result.modified and _drop_round_trip_casts(graph):
            graph.cleanup(remove_unused_graph_inputs=False)
        return result


def _constant_operand(node: gs.Node, resolver: ValueResolver) -> tuple[gs.Tensor, np.ndarray] | str:
    """The variable input and the single value of the constant one (the shift is always input 1)."""
    candidates = (1,) if node.op == "BitShift" else (1, 0)
    for index in candidates:
        value = resolver.resolve(node.inputs[index])
        if value is None:
            continue
        operand = node.inputs[1 - index]
        rank = rank_of(operand)
        if value.size != 1 or rank is None or value.ndim > rank:
            return "the constant operand must be one value of rank <= the other input's (known) rank: no broadcast"
        return operand, value
    return "no constant operand (shift or mask): no exact arithmetic form"


def _domain(x: gs.Tensor) -> BitDomain | str:
    dtype = dtype_of(x)
    if dtype is None:
        return "operand dtype unknown"
    if dtype in _SIGNED:
        return BitDomain(dtype.itemsize * 8, True, dtype, x, dtype)
    if dtype == np.dtype(np.uint8):
        return BitDomain(8, False, np.dtype(np.int32), None, dtype)
    producer = x.inputs[0] if len(x.inputs) == 1 else None
    if dtype in _UNSIGNED_OF.values() and producer is not None and producer.op == "Cast":
        source = dtype_of(producer.inputs[0])
        if source is not None and source in _SIGNED and _UNSIGNED_OF[source] == dtype:
            return BitDomain(dtype.itemsize * 8, True, source, producer.inputs[0], dtype)
    return (
        f"{dtype} operand: TensorRT supports integers as INT32/INT64 only (UINT8 at graph inputs and outputs), "
        "and this is not a same-width Cast of one"
    )


def _cast(ctx: RewriteContext, x: gs.Tensor, dtype: np.dtype) -> gs.Variable:
    return ctx.typed(dtype).Cast(x, to=onnx.helper.np_dtype_to_tensor_dtype(dtype))


class _Arithmetic:
    """The formulas of the module doc on one ``compute``-typed tensor; shared terms are built once."""

    def __init__(self, ctx: RewriteContext, domain: BitDomain, x: gs.Tensor) -> None:
        self.ctx, self.dom, self.x = ctx, domain, x
        self.n = domain.bits
        self._low: dict[int, gs.Tensor | None] = {}
        self._negative: gs.Tensor | None = None

    def c(self, value: int) -> np.ndarray:
        return np.array(value, dtype=self.dom.compute)

    def op(self, op_type: str, *inputs: gs.Tensor | np.ndarray, **attrs: Any) -> gs.Variable:
        return getattr(self.ctx.typed(self.dom.compute), op_type)(*inputs, **attrs)

    def negative(self) -> gs.Tensor:
        """1 where x < 0, else 0."""
        if self._negative is None:
            less = self.ctx.typed(np.dtype(bool)).Less(self.x, self.c(0))
            self._negative = _cast(self.ctx, less, self.dom.compute)
        return self._negative

    def low(self, k: int) -> gs.Tensor | None:
        """The low k bits of x as a non-negative value (None for k = 0; x itself for k = N)."""
        if k not in self._low:
            if k == 0:
                self._low[k] = None
            elif k == self.n:
                self._low[k] = self.x
            elif k == self.dom.compute.itemsize * 8 - 1:  # 2**k does not fit: clear the sign bit instead
                self._low[k] = self.op("Sub", self.x, self.op("Mul", self.negative(), self.c(-(1 << k))))
            else:
                self._low[k] = self.op("Mod", self.x, self.c(1 << k), fmod=0)
        return self._low[k]

    def floor_shift(self, s: int) -> gs.Tensor:
        """floor(x / 2**s) (an arithmetic shift for signed x), for 0 <= s < N."""
        if s == 0:
            return self.x
        if not self.dom.signed:
            return self.op("Div", self.x, self.c(1 << s))
        if s == self.dom.compute.itemsize * 8 - 1:
            return self.op("Neg", self.negative())
        low = self.low(s)
        assert low is not None
        return self.op("Div", self.op("Sub", self.x, low), self.c(1 << s))  # exact: x - low is a multiple of 2**s

    def shift_left(self, s: int) -> gs.Tensor:
        if s == 0:
            return self.x
        if not self.dom.signed:  # (x mod 2**(N-s)) * 2**s < 2**N
            return self.op("Mul", self.low(self.n - s), self.c(1 << s))
        # Bits 0..N-s-2 move up as a non-negative part; bit N-s-1 lands on the sign bit: worth -2**(N-1).
        top = self.n - s - 1
        sign = self.op("Mul", self.op("Mod", self.floor_shift(top), self.c(2), fmod=0), self.c(-(1 << (self.n - 1))))
        low = self.low(top)
        return sign if low is None else self.op("Add", self.op("Mul", low, self.c(1 << s)), sign)

    def shift_right(self, s: int) -> gs.Tensor:
        shifted = self.floor_shift(s)
        if s == 0 or not self.dom.signed or self.dom.out_dtype in _SIGNED:
            return shifted  # unsigned value, or a signed BitShift (opset 28): arithmetic shift
        # The logical shift of the bits of a negative x: the arithmetic one plus 2**(N-s).
        return self.op("Sub", shifted, self.op("Mul", self.negative(), self.c(-(1 << (self.n - s)))))

    def value_of(self, pattern: int) -> int:
        """The N-bit pattern as the domain holds it (two's complement when signed)."""
        return pattern - (1 << self.n) if self.dom.signed and pattern >> (self.n - 1) else pattern

    def and_(self, mask: int) -> gs.Tensor:
        if mask == 0:
            return self.op("Sub", self.x, self.x)
        terms: list[gs.Tensor] = []
        for start, stop in _runs(mask, self.n):
            high, low = self.low(stop), self.low(start)
            assert high is not None
            terms.append(high if low is None else self.op("Sub", high, low))
        total = terms[0]
        for term in terms[1:]:
            total = self.op("Add", total, term)
        return total

    def or_(self, mask: int) -> gs.Tensor:
        if mask == 0:
            return self.x
        return self.op("Add", self.op("Sub", self.x, self.and_(mask)), self.c(self.value_of(mask)))

    def xor(self, mask: int) -> gs.Tensor:
        if mask == 0:
            return self.x
        if mask == (1 << self.n) - 1:
            return self.not_()
        common = self.and_(mask)
        return self.op("Add", self.op("Sub", self.x, common), self.op("Sub", self.c(self.value_of(mask)), common))

    def not_(self) -> gs.Tensor:
        return self.op("Sub", self.c(self.value_of((1 << self.n) - 1)), self.x)


def _runs(mask: int, bits: int) -> list[tuple[int, int]]:
    """Maximal runs of ones of an N-bit mask as [start, stop) bit ranges."""
    runs, bit = [], 0
    while bit < bits:
        if mask >> bit & 1:
            start = bit
            while bit < bits and mask >> bit & 1:
                bit += 1
            runs.append((start, bit))
        bit += 1
    return runs


def _drop_round_trip_casts(graph: gs.Graph) -> bool:
    """``Cast(to=intN)`` of ``Cast(to=uintN)`` of an intN tensor is that tensor (same bits): make it an Identity."""
    changed = False
    for node in graph.nodes:
        if node.op != "Cast" or len(node.inputs) != 1 or len(node.inputs[0].inputs) != 1:
            continue
        inner = node.inputs[0].inputs[0]
        if inner.op != "Cast" or not inner.inputs:
            continue
        source = dtype_of(inner.inputs[0])
        to = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(node.attrs["to"]))
        middle = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(inner.attrs["to"]))
        if source in _SIGNED and to == source and middle == _UNSIGNED_OF[source]:
            node.op, node.attrs = "Identity", {}
            node.inputs[0] = inner.inputs[0]
            changed = True
    return changed
