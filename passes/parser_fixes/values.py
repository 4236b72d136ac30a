"""What the parser-fix passes know about a tensor before running the graph: its static shape, its dtype, and the
value of a small integer input that is computable now (an initializer, a ``Constant`` node, or shape arithmetic
on static shapes), so a rewrite can bake it in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from passes.base import STANDARD_DOMAINS

#: Values larger than this are never resolved: they are weights, not the axes, shapes or masks we bake in.
MAX_RESOLVED_ELEMENTS = 1 << 16

#: Deterministic ops that appear in shape arithmetic; a chain of them over resolvable inputs is evaluated.
SHAPE_ARITHMETIC_OPS = frozenset(
    {
        "Abs", "Add", "And", "Cast", "Ceil", "Clip", "Concat", "ConstantOfShape", "Div", "Equal", "Expand",
        "Flatten", "Floor", "Gather", "Greater", "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Max", "Min",
        "Mod", "Mul", "Neg", "Not", "Or", "Range", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSum", "Reshape",
        "Sign", "Slice", "Squeeze", "Sub", "Tile", "Transpose", "Unsqueeze", "Where",
    }
)  # fmt: skip


def static_shape(tensor: gs.Tensor) -> tuple[int, ...] | None:
    """The shape when every dimension is a known integer, else None."""
    shape = tensor.shape
    if shape is None or not all(isinstance(d, int | np.integer) and d >= 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)


def rank_of(tensor: gs.Tensor) -> int | None:
    """The tensor's rank, or None when its shape is unknown."""
    return None if tensor.shape is None else len(tensor.shape)


def dtype_of(tensor: gs.Tensor) -> np.dtype | None:
    """The numpy dtype; None when unknown or not a numpy type (graph-surgeon keeps some as ONNX enum values)."""
    dtype = tensor.dtype
    if dtype is None and len(tensor.inputs) == 1 and tensor.inputs[0].op == "Cast":
        dtype = tensor.inputs[0].attrs.get("to")  # a graph without value_info still says what a Cast makes
    if dtype is None:
        return None
    try:
        if isinstance(dtype, int) and not isinstance(dtype, bool):
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
        return np.dtype(dtype)
    except (TypeError, KeyError, ValueError):
        return None


def is_omitted(tensor: gs.Tensor) -> bool:
    """Is this an omitted optional input (a variable with an empty name)?"""
    return isinstance(tensor, gs.Variable) and not tensor.name


class ValueResolver:
    """Resolves small computable values, memoised for one pass run. ``resolve(t)`` is None when not computable."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self._memo: dict[int, np.ndarray | None] = {}

    def resolve(self, tensor: gs.Tensor, depth: int = 0) -> np.ndarray | None:
        """The tensor's value when it is a constant or computed from constants by shape ops; else None."""
        key = id(tensor)
        if key not in self._memo:
            self._memo[key] = None  # a cycle (invalid graph) resolves to None rather than recursing forever
            self._memo[key] = self._resolve(tensor, depth)
        return self._memo[key]

    def _resolve(self, tensor: gs.Tensor, depth: int) -> np.ndarray | None:
        if isinstance(tensor, gs.Constant):
            shape = tensor.shape
            if shape is not None and int(np.prod(shape)) > MAX_RESOLVED_ELEMENTS:
                return None
            return np.asarray(tensor.values)
        if depth > 32 or len(tensor.inputs) != 1:
            return None
        node = tensor.inputs[0]
        if node.domain not in STANDARD_DOMAINS:
            return None
        if node.op == "Constant":
            return _constant_attr(node)
        if node.op in ("Shape", "Size"):
            return _shape_value(node)
        if node.op not in SHAPE_ARITHMETIC_OPS:
            return None
        inputs = [None if is_omitted(t) else self.resolve(t, depth + 1) for t in node.inputs]
        if any(v is None for t, v in zip(node.inputs, inputs, strict=True) if not is_omitted(t)):
            return None
        return _evaluate(node, inputs, tensor, self.opset)


def _constant_attr(node: gs.Node) -> np.ndarray | None:
    attrs = node.attrs
    if isinstance(attrs.get("value"), gs.Constant):
        return np.asarray(attrs["value"].values)
    for name, dtype in (("value_int", np.int64), ("value_ints", np.int64), ("value_float", np.float32)):
        if name in attrs:
            return np.asarray(attrs[name], dtype=dtype)
    if "value_floats" in attrs:
        return np.asarray(attrs["value_floats"], dtype=np.float32)
    return None  # sparse and string constants are never axes, shapes or masks


def _shape_value(node: gs.Node) -> np.ndarray | None:
    shape = static_shape(node.inputs[0])
    if shape is None:
        return None
    if node.op == "Size":
        return np.asarray(int(np.prod(shape)), dtype=np.int64)
    start, end = node.attrs.get("start", 0), node.attrs.get("end")
    return np.asarray(shape[slice(start, end)], dtype=np.int64)


def _evaluate(node: gs.Node, inputs: list[np.ndarray | None], wanted: gs.Tensor, opset: int) -> np.ndarray | None:
    """Run one node on the ONNX reference evaluator; only small integer or bool results count as shape values."""
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    outputs = [f"out{i}" for i in range(len(node.outputs))]
    attrs = {k: _attr_value(v) for k, v in node.attrs.items()}
    proto = onnx.helper.make_node(node.op, names, outputs, **attrs)
    initializers = [numpy_helper.from_array(v, n) for n, v in zip(names, inputs, strict=True) if v is not None]
    graph = onnx.helper.make_graph([proto], "resolve", [], [onnx.helper.ValueInfoProto(name=o) for o in outputs])
    graph.initializer.extend(initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        results: list[Any] = list(ReferenceEvaluator(model).run(None, {}))
    except Exception:  # not evaluable here (bad attributes, shapes): the value is simply not known
        return None
    index = next(i for i, t in enumerate(node.outputs) if t is wanted)
    value = np.asarray(results[index])
    if value.size > MAX_RESOLVED_ELEMENTS or not (np.issubdtype(value.dtype, np.integer) or value.dtype == bool):
        return None
    return value


def _attr_value(value: Any) -> Any:
    if isinstance(value, gs.Constant):
        return numpy_helper.from_array(np.asarray(value.values))
    return value
