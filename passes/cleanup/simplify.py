"""Algebraic simplifications that take nodes out: an operation with its identity element (``x + 0``, ``x * 1``),
a chain of two scalings by constants, and a chain of two Unsqueeze (or two Squeeze) nodes, which one node does.

Both are rules (:mod:`passes.rules`), each also the pass that runs it: they leave every graph output name as it is
and rewrite only what they can prove equal from constants, shapes and dtypes recorded in the graph; the pure
``check`` returns why a node was left. One walk over the nodes, constant values read at most once per pass run
(without caching them on the graph, as folding does), and one linear-time cleanup when something changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from passes.base import STANDARD_DOMAINS
from passes.model_io.external_data import constant_values
from passes.rules import Facts, RewriteContext, RewriteRule

#: op -> (its identity element, the input positions where that element may stand). Subtracting zero and dividing
#: by one are identities only with the constant second.
IDENTITY_ELEMENTS: Mapping[str, tuple[int, tuple[int, ...]]] = {
    "Add": (0, (1, 0)),
    "Sub": (0, (1,)),
    "Mul": (1, (1, 0)),
    "Div": (1, (1,)),
}


# -- identity elements -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bypass:
    """Consumers of the node's output read ``operand`` instead."""

    operand: gs.Tensor


class RemoveIdentityElements(RewriteRule[Bypass]):
    """Bypass ``x + 0``, ``0 + x``, ``x - 0``, ``x * 1``, ``1 * x`` and ``x / 1`` where the result is ``x`` exactly.

    The constant must be all zeros (or all ones), of ``x``'s dtype, and must not broadcast ``x`` to another shape:
    its rank is at most ``x``'s and each of its dims is 1 or equal to ``x``'s static dim there (a scalar constant
    broadcasts within any ``x``, even one of unknown rank). A node whose output is a graph output is kept, so graph
    output names never change. For floats, ``-0.0 + 0.0`` is ``+0.0``: the only change is the sign of a zero result,
    which compares equal (the exporter writes zero attention masks and zero biases as ``+0.0``).
    """

    name = "remove_identity_elements"
    ops = frozenset(IDENTITY_ELEMENTS)

    def check(self, node: gs.Node, facts: Facts) -> Bypass | str:
        """The operand to keep, or why the node stays."""
        if len(node.inputs) != 2 or len(node.outputs) != 1:
            return "not a node with two inputs and one output"
        if id(node.outputs[0]) in facts.graph_outputs:
            return "its output is a graph output"
        values = facts.memo("constant_values", ConstantValues)
        element, positions = IDENTITY_ELEMENTS[node.op]
        reasons = []
        for position in positions:
            constant, operand = node.inputs[position], node.inputs[1 - position]
            reason = _identity_reason(constant, operand, node.outputs[0], element, values)
            if reason is None:
                return Bypass(operand)
            reasons.append(f"input {position}: {reason}")
        return "; ".join(reasons)

    def rewrite(self, plan: Bypass, ctx: RewriteContext) -> gs.Tensor:
        """Consumers read the operand."""
        return plan.operand


def _identity_reason(
    constant: gs.Tensor, operand: gs.Tensor, output: gs.Tensor, element: int, values: ConstantValues
) -> str | None:
    """None when ``op(operand, constant)`` is ``operand`` (``element`` being the op's identity), else why not."""
    if not isinstance(constant, gs.Constant):
        return "not a constant"
    dtype = numpy_dtype(constant.dtype)
    if dtype is None:
        return f"constant of dtype {constant.dtype}, not a NumPy one"
    operand_dtype = numpy_dtype(operand.dtype)
    if operand_dtype is None:  # the op's output has its operands' dtype
        operand_dtype = numpy_dtype(output.dtype)
    if operand_dtype != dtype:
        return (
            f"constant of dtype {dtype}, other operand of {'unknown dtype' if operand_dtype is None else operand_dtype}"
        )
    reason = broadcast_reason(tuple(constant.shape), operand.shape)
    if reason is not None:
        return reason
    if not values.all_equal(constant, element):
        return f"constant not all {element}"
    return None


def broadcast_reason(constant_shape: Sequence[int], shape: Sequence[Any] | None) -> str | None:
    """None when broadcasting a tensor of ``shape`` with a constant of ``constant_shape`` surely gives ``shape``.

    >>> broadcast_reason((1, 1, 197), [1, "heads", 197]) is None
    True
    >>> broadcast_reason((4,), ["n"])  # n may be 1 at run time
    "constant dim 4 against dim 'n' (axis -1): broadcasting may grow it"
    """
    if not constant_shape:
        return None  # a scalar broadcasts within any shape
    if shape is None:
        return "other operand of unknown rank"
    if len(constant_shape) > len(shape):
        return f"constant of rank {len(constant_shape)} raises the rank {len(shape)} of the other operand"
    for axis in range(-1, -len(constant_shape) - 1, -1):
        have, dim = constant_shape[axis], shape[axis]
        if have != 1 and not (isinstance(dim, (int, np.integer)) and dim == have):
            return f"constant dim {have} against dim {dim!r} (axis {axis}): broadcasting may grow it"
    return None


def numpy_dtype(dtype: Any) -> np.dtype | None:
    """``dtype`` as a NumPy dtype, or None (unknown, or an ONNX type graph-surgeon has no NumPy type for)."""
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, type) and issubclass(dtype, np.generic):
        return np.dtype(dtype)
    return None


class ConstantValues:
    """``np.all(values == element)`` per constant, read at most once per pass run and not cached on the graph
    (loading every lazy initializer would keep a second copy of the weights)."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, int], bool] = {}

    def all_equal(self, constant: gs.Constant, element: int) -> bool:
        """Is every element of ``constant`` equal to ``element``? (memoised per constant)"""
        key = (id(constant), element)
        if key not in self._known:
            array = constant_values(constant).reshape(-1)
            # the first element settles most constants (weights, scales) without a pass over all of them
            self._known[key] = array.size > 0 and bool(array[0] == element) and bool((array == element).all())
        return self._known[key]


# -- chains of scalings ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """The node becomes ``Mul(source, factor)``; the inner scaling is left unused."""

    source: gs.Tensor
    factor: np.ndarray


class MergeScaleChains(RewriteRule[Scale]):
    """``x * a * b``, ``x / a * b``, ``x * a / b`` and ``x / a / b``, where ``a`` and ``b`` are one-element float
    constants, become one ``Mul(x, k)`` with ``k`` computed in float64 and rounded once to ``x``'s dtype.

    One rounding instead of two (within an ulp of the chain), one node fewer, and ``x / c * c`` becomes ``x * 1``,
    which :class:`RemoveIdentityElements` then takes out. TensorRT-RTX's Myelin compiler fails on such a chain
    between two Reshapes feeding a MatMul (AutoencoderRAE's decoder: ``CHECK(desired_so.size() == t->dim_count())``),
    and builds the single Mul. Left: an inner result read elsewhere or a graph output, a constant that broadcasts
    ``x`` to another shape, a zero or non-finite constant, and a constant of another dtype than ``x``.
    """

    name = "merge_scale_chains"
    ops = frozenset({"Mul", "Div"})

    def check(self, node: gs.Node, facts: Facts) -> Scale | str:
        """The source and the combined factor, or why the node stays."""
        outer = _scaling(node)
        if isinstance(outer, str):
            return outer
        middle, outer_factor, outer_constant = outer
        if id(middle) in facts.graph_outputs or len(middle.outputs) != 1 or len(middle.inputs) != 1:
            return "its scaled input is a graph output, read elsewhere too, or not computed by a node"
        inner_node = middle.inputs[0]
        if inner_node.op not in self.ops or inner_node.domain not in STANDARD_DOMAINS:
            return "its input is not a scaling by a constant"
        inner = _scaling(inner_node)
        if isinstance(inner, str):
            return f"the inner {inner_node.op}: {inner}"
        source, inner_factor, inner_constant = inner
        dtype = numpy_dtype(source.dtype) or numpy_dtype(middle.dtype)
        if dtype is None or {inner_constant.dtype, outer_constant.dtype} != {dtype}:
            return "the constants' dtype differs from the scaled tensor's, or it is unknown"
        for constant in (inner_constant, outer_constant):
            reason = broadcast_reason(tuple(constant.shape), source.shape)
            if reason is not None:
                return reason
        shape = max(inner_constant.shape, outer_constant.shape, key=len)
        return Scale(source, np.asarray(inner_factor * outer_factor, dtype=dtype).reshape(shape))

    def rewrite(self, plan: Scale, ctx: RewriteContext) -> gs.Tensor:
        """One Mul of the source by the combined factor."""
        return ctx.op.Mul(plan.source, ctx.constant(plan.factor, "factor"))


def _scaling(node: gs.Node) -> tuple[gs.Tensor, float, np.ndarray] | str:
    """``(x, f, c)`` when ``node`` computes ``x * c`` (``f = c``) or ``x / c`` (``f = 1/c``, in float64), ``c`` a
    one-element finite non-zero float constant; else why not."""
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return "not a node with two inputs and one output"
    for position in (1, 0) if node.op == "Mul" else (1,):
        constant = node.inputs[position]
        if not isinstance(constant, gs.Constant) or int(np.prod(constant.shape)) != 1:
            continue
        value = constant_values(constant)
        if value.dtype.kind != "f" or not np.isfinite(value).all() or not value.all():
            return "its constant is not a finite non-zero float"
        number = float(value.reshape(-1)[0])
        return node.inputs[1 - position], number if node.op == "Mul" else 1.0 / number, value
    return "no one-element constant operand"


# -- Unsqueeze and Squeeze chains ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Merge:
    """The outer node reads ``source`` (the inner node's input) with ``axes``; the inner node is left unused."""

    source: gs.Tensor
    axes: tuple[int, ...]


class MergeSqueezeChains(RewriteRule[Merge]):
    """``Unsqueeze(Unsqueeze(x, a), b)`` becomes ``Unsqueeze(x, c)``, and ``Squeeze(Squeeze(x, a), b)``
    ``Squeeze(x, c)``, when the inner node's output feeds only the outer node and both axes are constants.

    ``c`` is computed from ``a`` and ``b`` (:func:`merged_unsqueeze_axes`, :func:`merged_squeeze_axes`); negative
    axes need the rank of ``x``, so they are merged only when it is recorded. The outer node keeps its name and its
    output; its axes become a new constant ``<outer>/axes`` (an attribute before opset 13, as it was).
    """

    name = "merge_squeeze_chains"
    ops = frozenset({"Unsqueeze", "Squeeze"})

    def check(self, node: gs.Node, facts: Facts) -> Merge | str:
        """The merged input and axes for the outer ``node``, or why it stays."""
        if not node.inputs or not node.inputs[0].inputs:
            return "its input has no producer"
        inner = node.inputs[0].inputs[0]
        if inner.op != node.op or inner.domain not in STANDARD_DOMAINS or len(inner.outputs) != 1:
            return f"its input is not computed by another {node.op}"
        middle = inner.outputs[0]
        if id(middle) in facts.graph_outputs or len(middle.outputs) != 1 or sum(t is middle for t in node.inputs) != 1:
            return f"the inner {node.op}'s output is read elsewhere too"
        outer_axes, inner_axes = constant_axes(node), constant_axes(inner)
        if outer_axes is None or inner_axes is None:
            return "axes not given as constants"
        if not outer_axes or not inner_axes:  # an empty axes list is no list for Squeeze, and invalid for Unsqueeze
            return "empty axes"
        source = inner.inputs[0]
        rank = None if source.shape is None else len(source.shape)
        merge = merged_unsqueeze_axes if node.op == "Unsqueeze" else merged_squeeze_axes
        axes = merge(inner_axes, outer_axes, rank)
        if axes is None:
            return f"axes {list(inner_axes)} then {list(outer_axes)} cannot be merged for input rank {rank}"
        return Merge(source, tuple(axes))

    def rewrite(self, plan: Merge, ctx: RewriteContext) -> None:
        """The outer node reads the inner one's input with the merged axes (edited in place)."""
        node = ctx.node
        node.inputs[0] = plan.source
        if "axes" in node.attrs:
            node.attrs["axes"] = list(plan.axes)
        else:
            node.inputs[1] = ctx.constant(np.array(plan.axes, np.int64), "axes")


def constant_axes(node: gs.Node) -> tuple[int, ...] | None:
    """The axes of an Unsqueeze or Squeeze: its ``axes`` attribute (before opset 13) or constant second input."""
    if "axes" in node.attrs:
        value: Any = node.attrs["axes"]
    elif len(node.inputs) == 2 and isinstance(node.inputs[1], gs.Constant):
        value = constant_values(node.inputs[1])
    else:
        return None
    array = np.asarray(value)
    if array.ndim > 1 or not np.issubdtype(array.dtype, np.integer):
        return None
    return tuple(int(a) for a in array.reshape(-1))


def merged_unsqueeze_axes(first: Sequence[int], second: Sequence[int], rank: int | None) -> list[int] | None:
    """Axes of the one Unsqueeze equal to ``Unsqueeze(Unsqueeze(x, first), second)`` for ``x`` of rank ``rank``
    (None: unknown), or None when a negative axis needs the unknown rank or the axes are invalid.

    ``second`` indexes the first Unsqueeze's output. Walking the final output's positions: those in ``second``
    are the second's new dims, the others are the first's output in order, and the first's new dims among them are
    the positions ``first`` named there.

    >>> merged_unsqueeze_axes([1, 2], [3], 1)       # [n] -> [n, 1, 1] -> [n, 1, 1, 1]
    [1, 2, 3]
    >>> merged_unsqueeze_axes([0], [-1], 2)         # [a, b] -> [1, a, b] -> [1, a, b, 1]
    [0, 3]
    """
    middle_rank = None if rank is None else rank + len(first)
    inner = _normalized(first, middle_rank)
    outer = _normalized(second, None if middle_rank is None else middle_rank + len(second))
    if inner is None or outer is None:
        return None
    axes, middle = [], 0
    for position in range(_positions(inner, outer)):
        if position in outer:
            axes.append(position)
        else:
            if middle in inner:
                axes.append(position)
            middle += 1
    return axes


def merged_squeeze_axes(first: Sequence[int], second: Sequence[int], rank: int | None) -> list[int] | None:
    """Axes of the one Squeeze equal to ``Squeeze(Squeeze(x, first), second)`` for ``x`` of rank ``rank``
    (None: unknown), or None when a negative axis needs the unknown rank or the axes are invalid.

    ``second`` indexes the first Squeeze's output: the positions of ``x`` that ``first`` does not remove, in order.

    >>> merged_squeeze_axes([0], [-1], 3)           # [1, a, 1] -> [a, 1] -> [a]
    [0, 2]
    """
    inner = _normalized(first, rank)
    outer = _normalized(second, None if rank is None else rank - len(first))
    if inner is None or outer is None:
        return None
    axes, middle = set(inner), 0
    for position in range(_positions(inner, outer)):
        if position not in inner:
            if middle in outer:
                axes.add(position)
            middle += 1
    return sorted(axes)


def _positions(inner: set[int], outer: set[int]) -> int:
    """A bound on the positions the walks above visit: an axis moves by at most one per axis of the other list."""
    return max(inner | outer, default=-1) + len(inner) + len(outer) + 1


def _normalized(axes: Sequence[int], rank: int | None) -> set[int] | None:
    """``axes`` made non-negative for ``rank``; None if one is out of range, repeated, or negative with no rank."""
    result = set()
    for axis in axes:
        if rank is not None and not -rank <= axis < rank:
            return None
        if axis < 0:
            if rank is None:
                return None
            axis += rank
        result.add(axis)
    return result if len(result) == len(axes) else None
