"""Automatic export of ``torch.library`` ops that the ONNX exporter cannot translate.

Each such op becomes one opaque ONNX node: domain = the op's namespace, op_type = its name, tensor arguments as
inputs (an omitted optional tensor is an empty input), non-tensor arguments as typed attributes taken from the
op's schema (bool as int 0/1, since ONNX has no bool attribute), outputs as the schema says. The lowering pass
later replaces the node with whatever a registered converter builds.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from onnx.defs import OpSchema

from converters.errors import ExportError
from converters.targets import torch_op_key

logger = logging.getLogger(__name__)

#: Namespaces whose ops the exporter's own library translates; a custom op lives anywhere else.
BUILTIN_NAMESPACES = frozenset({"aten", "prims", "_operator", "higher_order", "quantized_decomposed", "onnx"})

_ALL_TYPES = [
    f"tensor({t})"
    for t in ("float", "float16", "bfloat16", "double", "int64", "int32", "int16", "int8", "uint8", "bool")
]
_ATTRIBUTE_TYPES = {
    "float": OpSchema.AttrType.FLOAT,
    "int": OpSchema.AttrType.INT,
    "SymInt": OpSchema.AttrType.INT,
    "bool": OpSchema.AttrType.INT,
    "str": OpSchema.AttrType.STRING,
    "int[]": OpSchema.AttrType.INTS,
    "SymInt[]": OpSchema.AttrType.INTS,
    "float[]": OpSchema.AttrType.FLOATS,
    "bool[]": OpSchema.AttrType.INTS,
    "str[]": OpSchema.AttrType.STRINGS,
    "number": OpSchema.AttrType.FLOAT,  # a Scalar argument
}
#: Arguments that say where or how a tensor is made, not what it holds: not written to the node.
_DROPPED_TYPES = frozenset(
    {"Device", "Optional[Device]", "Generator", "Optional[Generator]", "Layout", "Optional[Layout]"}
)


def custom_ops_in(program: torch.export.ExportedProgram) -> list[torch._ops.OpOverload]:
    """The torch.library ops called anywhere in ``program`` (nested graphs included), in first-use order."""
    found: dict[torch._ops.OpOverload, None] = {}
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            target = node.target
            is_op = node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            if is_op and target.namespace not in BUILTIN_NAMESPACES:
                found[target] = None
    return list(found)


def opaque_translations(
    ops: Iterable[torch._ops.OpOverload],
    user_table: dict[Any, Callable[..., Any]] | None = None,
    converted: Iterable[torch._ops.OpOverload] = (),
) -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """Opaque translations for ``ops`` the exporter does not know, and for every op in ``converted`` (ops with a
    registered converter: the user's converter overrides the exporter's own translation). The user's own table
    entries take precedence over both."""
    user_table = user_table or {}
    forced = set(converted)
    table: dict[torch._ops.OpOverload, Callable[..., Any]] = {}
    for op in [*ops, *forced]:
        if op in user_table or (op not in forced and _exporter_translates(op)):
            continue
        table[op] = opaque_translation(op)
        logger.debug("exporting %s as an opaque node %s", op, torch_op_key(op))
    return {**table, **user_table}


@functools.cache
def opaque_translation(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """An exporter translation that writes ``op`` as one node of its own domain (one per op: every export asks for
    the translations of every op with a converter)."""
    from onnxscript.values import Op, Opset

    schema, tensor_args, attr_args = _onnx_schema(op)
    key = torch_op_key(op)
    onnx_op = Op(Opset(key.domain, 1), key.op_type, schema)
    arguments = op._schema.arguments

    defaults = {a.name: a.default_value for a in arguments if a.has_default_value()}

    def translate(*args: Any, **kwargs: Any) -> Any:
        values = {a.name: (a.default_value if a.has_default_value() else None) for a in arguments}
        values.update(zip((a.name for a in arguments), args, strict=False))
        values.update(kwargs)
        tensors = [values[name] for name in tensor_args]
        while tensors and tensors[-1] is None:  # trailing omitted optional inputs are simply left out
            tensors.pop()
        # an empty list cannot be written as an attribute (its type is unknown); left out, a converter's ctx.attrs
        # reads the schema default, which is exact when that default is the same empty list (avg_pool3d's stride=[])
        attrs = {
            name: _attribute_value(values[name])
            for name in attr_args
            if values[name] is not None and not (_empty_list(values[name]) and _empty_list(defaults.get(name)))
        }
        return onnx_op(*tensors, **attrs)

    translate.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                a.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=a.default_value if a.has_default_value() else inspect.Parameter.empty,
            )
            for a in arguments
        ]
    )
    translate.__name__ = f"opaque_{key.domain}_{key.op_type}".replace(".", "_")
    return translate


def _onnx_schema(op: torch._ops.OpOverload) -> tuple[OpSchema, list[str], list[str]]:
    key = torch_op_key(op)
    inputs: list[OpSchema.FormalParameter] = []
    attributes: list[OpSchema.Attribute] = []
    tensor_args: list[str] = []
    attr_args: list[str] = []
    for arg in op._schema.arguments:
        type_text = str(arg.type)
        if type_text in ("Tensor", "Optional[Tensor]"):
            option = (
                OpSchema.FormalParameterOption.Optional
                if type_text.startswith("Optional")
                else OpSchema.FormalParameterOption.Single
            )
            inputs.append(OpSchema.FormalParameter(arg.name, f"T{len(inputs)}", param_option=option))
            tensor_args.append(arg.name)
            continue
        if type_text in _DROPPED_TYPES:
            continue
        base = type_text.removeprefix("Optional[").removesuffix("]") if type_text.startswith("Optional[") else type_text
        base = base.replace("List[int]", "int[]").replace("List[float]", "float[]").replace("List[bool]", "bool[]")
        base = base.replace("List[str]", "str[]").replace("List[SymInt]", "SymInt[]")
        if base not in _ATTRIBUTE_TYPES:
            raise ExportError(
                f"argument {arg.name!r} of custom op {op} has type {type_text}, which cannot be an ONNX attribute",
                node=str(op),
                fix="use Tensor, Tensor?, int, float, bool, str or lists of int/float/bool/str in the op's schema, "
                "or pass your own custom_translation_table entry for it",
            )
        attributes.append(OpSchema.Attribute(arg.name, _ATTRIBUTE_TYPES[base], "", required=False))
        attr_args.append(arg.name)
    outputs = []
    for i, ret in enumerate(op._schema.returns):
        if str(ret.type) != "Tensor":
            raise ExportError(
                f"custom op {op} returns {ret.type}; only tensors (one or several) can be node outputs",
                node=str(op),
                fix="return Tensor or a tuple of Tensors from the op",
            )
        outputs.append(OpSchema.FormalParameter(ret.name or f"out{i}", f"R{i}"))
    constraints = [(p.type_str, _ALL_TYPES, "") for p in (*inputs, *outputs)]
    schema = OpSchema(
        key.op_type, key.domain, 1, inputs=inputs, outputs=outputs, type_constraints=constraints, attributes=attributes
    )
    return schema, tensor_args, attr_args


def _attribute_value(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, list | tuple):
        return [int(v) if isinstance(v, bool) else v for v in value]
    return value


def _empty_list(value: Any) -> bool:
    return isinstance(value, list | tuple) and len(value) == 0


def _exporter_translates(op: torch._ops.OpOverload) -> bool:
    registry = _exporter_registry()
    return registry is not None and bool(registry.is_registered(op))


@functools.cache
def _exporter_registry() -> Any:
    try:  # a private API of torch.onnx; without it every op outside the builtin namespaces is treated as custom
        from torch.onnx._internal.exporter._registration import ONNXRegistry

        return ONNXRegistry.from_torchlib()
    except Exception:  # pragma: no cover - depends on the torch version
        logger.debug("torch.onnx registry unavailable; treating every non-aten op as custom")
        return None
