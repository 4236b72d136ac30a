"""The converter's whole world: the node being replaced, its inputs and attributes, and node builders.

Every node and tensor a converter creates is named after the replaced node (``<node>/<Op>_<n>``), so a layer
in an engine, a line in a report and a module in PyTorch can be matched up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_graphsurgeon as gs

from converters.errors import ConversionError
from converters.plugins.nodes import PLUGIN_DOMAIN, plugin_node_attributes
from converters.settings import Settings
from converters.targets import OpKey

if TYPE_CHECKING:  # the ONNX-level users (the parser fixes, `pipeline check`) run without importing torch
    import torch

TensorLike = Any  # a gs.Tensor, a numpy array or a Python number


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken``, which is added to it."""
    candidate, i = base, 0
    while candidate in taken:
        i += 1
        candidate = f"{base}_{i}"
    taken.add(candidate)
    return candidate


class ConverterContext:
    """What a converter reads and how it builds. ``ctx.op.Mul(a, b)`` creates a node and returns its output.

    - ``ctx.node``: the graph-surgeon node being replaced; ``ctx.key``: its op.
    - ``ctx.inputs``: its inputs in order (``None`` for an omitted optional input); ``ctx.input("bias")`` by the
      torch schema's argument name. A ``gs.Constant`` input exposes its numpy array as ``.values``.
    - ``ctx.attrs``: attributes, typed by the torch op's schema (bool, int, float, str, lists) when there is one.
    - ``ctx.input_dtypes`` / ``ctx.input_shapes``: numpy dtypes and shapes (``str`` for a symbolic dimension).
    - ``ctx.opset``, ``ctx.settings``, ``ctx.is_dynamic``.
    """

    def __init__(
        self,
        graph: gs.Graph,
        node: gs.Node,
        key: OpKey,
        settings: Settings,
        torch_op: torch._ops.OpOverload | None = None,
        *,
        names: set[str] | None = None,
    ) -> None:
        self.graph = graph
        self.node = node
        self.key = key
        self.settings = settings
        self.torch_op = torch_op
        self.created: list[gs.Node] = []
        # ``names``: the graph's node and tensor names, shared by the caller across many nodes (one pass over the
        # graph instead of one per node); fresh names are added to it.
        self._names = names if names is not None else {t for t in graph.tensors()} | {n.name for n in graph.nodes}
        self._tensor_args = _tensor_argument_names(torch_op) if torch_op is not None else []
        self.inputs: list[gs.Tensor | None] = [None if _omitted(t) else t for t in node.inputs]
        if torch_op is not None:
            self.inputs += [None] * (len(self._tensor_args) - len(self.inputs))  # trailing omitted optionals
        self.attrs: dict[str, Any] = _typed_attrs(node, torch_op)
        self.op = _OpBuilder(self)

    @property
    def name(self) -> str:
        """The replaced node's name: every node and tensor the converter makes is named after it."""
        return str(self.node.name)

    @property
    def opset(self) -> int:
        """The graph's default-domain opset."""
        return int(self.graph.opset)

    @property
    def input_dtypes(self) -> list[np.dtype | None]:
        """The numpy dtype of each input, None where unknown or omitted."""
        return [None if t is None else _dtype_of(t) for t in self.inputs]

    @property
    def input_shapes(self) -> list[tuple[int | str, ...] | None]:
        """The shape of each input: ints for static dims, strings for symbolic ones; None where unknown."""
        return [None if t is None or t.shape is None else tuple(t.shape) for t in self.inputs]

    @property
    def is_dynamic(self) -> bool:
        """Does any input have a symbolic or unknown dimension?"""
        return any(isinstance(d, str) or d is None for s in self.input_shapes if s is not None for d in s)

    def input(self, name: str) -> gs.Tensor | None:
        """An input by the torch op schema's argument name (``ctx.input("bias")``)."""
        if name not in self._tensor_args:
            raise ConversionError(
                f"{self.key} has no tensor argument {name!r}",
                node=self.name,
                fix=f"its tensor arguments are: {', '.join(self._tensor_args) or 'none (not a torch op)'}",
            )
        return self.inputs[self._tensor_args.index(name)]

    def constant(self, value: Any, name: str = "const") -> gs.Constant:
        """A constant tensor named after the node; numpy arrays keep their dtype, Python floats become float32."""
        array = np.asarray(value)
        if array.dtype == np.float64 and not isinstance(value, np.ndarray):
            array = array.astype(np.float32)
        # np.ascontiguousarray would turn a 0-d array into shape [1], changing the rank of everything it touches
        return gs.Constant(self.fresh_name(name), np.ascontiguousarray(array).reshape(array.shape))

    def fresh_name(self, hint: str) -> str:
        """A name for a new node or tensor, unique in the graph and named after the replaced node."""
        return unique_name(f"{self.name}/{hint}", self._names)

    def typed(self, dtype: Any) -> Any:
        """The ``ctx.op`` builder whose outputs record ``dtype``: ``ctx.typed(np.int64).Mod(x, k, fmod=0)``.

        For rewrites inside the pass list, whose later passes read the dtypes of intermediate tensors (``dtype`` is
        not a keyword of ``ctx.op`` itself: EyeLike and the Random ops have a ``dtype`` attribute)."""
        return _OpBuilder(self, None if dtype is None else np.dtype(dtype))

    def make_node(
        self,
        op_type: str,
        inputs: Sequence[TensorLike | None],
        attrs: dict[str, Any],
        outputs: int,
        domain: str = "",
        dtype: np.dtype | None = None,
    ) -> list[gs.Variable]:
        """Add an ``op_type`` node reading ``inputs`` (numbers become constants) and return its output tensors."""
        node_name = self.fresh_name(op_type)
        # an omitted optional input: a fresh empty tensor each time (a shared one would collect every consumer)
        tensors = [gs.Variable.empty() if t is None else self._as_tensor(t) for t in inputs]
        outs = [gs.Variable(self.fresh_name(f"{op_type}_out{i}"), dtype=dtype) for i in range(outputs)]
        node = gs.Node(op_type, node_name, attrs=attrs, inputs=tensors, outputs=outs, domain=domain or None)
        self.graph.nodes.append(node)
        self.created.append(node)
        return outs

    def plugin(
        self,
        name: str,
        inputs: Sequence[TensorLike | None],
        attrs: dict[str, Any] | None = None,
        *,
        namespace: str,
        version: str = "1",
        outputs: int = 1,
    ) -> Any:
        """A plugin node (README, "Plugins"): TensorRT's parser imports it as plugin ``namespace::name``, and ONNX
        Runtime runs it when a CPU reference for ``name`` is registered (``register_plugin`` does both).
        Returns its output (a list for several). ``attrs``: bool, int (int32), float, str, lists of them (written
        as JSON strings, which both runtimes read) and numpy arrays (native INTS/FLOATS, TensorRT only)."""
        if not name or "." in name:
            raise ConversionError(f"invalid plugin name {name!r}", node=self.name, fix="a plugin name has no '.'")
        node_attrs = plugin_node_attributes(attrs or {}, namespace=namespace, version=version)
        outs = self.make_node(name, inputs, node_attrs, outputs, domain=PLUGIN_DOMAIN)
        return outs[0] if outputs == 1 else outs

    def _as_tensor(self, value: TensorLike) -> gs.Tensor:
        if isinstance(value, gs.Tensor):
            return value
        if isinstance(value, bool | int | float | np.ndarray | np.generic):
            return self.constant(value)
        raise ConversionError(
            f"cannot use {type(value).__name__} as a node input",
            node=self.name,
            fix="pass graph tensors (ctx.inputs), numpy arrays or Python numbers",
        )


class _OpBuilder:
    """``ctx.op.Add(a, b)``, ``ctx.op.Split(x, axis=1, outputs=2)``, ``ctx.op.Custom(x, domain="trt")``."""

    def __init__(self, ctx: ConverterContext, dtype: np.dtype | None = None) -> None:
        self._ctx = ctx
        self._dtype = dtype

    def __getattr__(self, op_type: str) -> Any:
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def build(*inputs: TensorLike | None, outputs: int = 1, domain: str = "", **attrs: Any) -> Any:
            outs = self._ctx.make_node(op_type, inputs, attrs, outputs, domain, self._dtype)
            return outs[0] if outputs == 1 else outs

        return build


def _omitted(tensor: gs.Tensor) -> bool:
    return isinstance(tensor, gs.Variable) and tensor.name == ""


def _dtype_of(tensor: gs.Tensor) -> np.dtype | None:
    if isinstance(tensor, gs.Constant):
        return np.dtype(tensor.values.dtype)
    return None if tensor.dtype is None else np.dtype(tensor.dtype)


def _tensor_argument_names(op: torch._ops.OpOverload) -> list[str]:
    return [a.name for a in op._schema.arguments if _is_tensor_type(a.type)]


def _is_tensor_type(t: Any) -> bool:
    text = str(t)
    return text in ("Tensor", "Optional[Tensor]", "Tensor?")


def _typed_attrs(node: gs.Node, op: torch._ops.OpOverload | None) -> dict[str, Any]:
    attrs = dict(node.attrs)
    if op is None:
        return attrs
    typed: dict[str, Any] = {}
    for arg in op._schema.arguments:
        if _is_tensor_type(arg.type):
            continue
        if arg.name in attrs:
            typed[arg.name] = _from_attribute(attrs[arg.name], str(arg.type))
        elif arg.has_default_value():
            typed[arg.name] = arg.default_value
        else:
            typed[arg.name] = None  # an optional scalar passed as None is not written as an attribute
    return typed


def _from_attribute(value: Any, torch_type: str) -> Any:
    if torch_type.startswith("bool") or torch_type == "Optional[bool]":
        return bool(value)
    if torch_type.endswith("[]") or torch_type.startswith("List"):
        return list(value)
    return value
