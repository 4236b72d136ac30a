"""The plugin node: how its attributes are written, and how a runtime finds the torch op behind it.

One node serves both runtimes (TRT_REFERENCE 4.2, 4.4)::

    domain           ai.onnx.contrib   onnxruntime-extensions finds Python ops in this domain only
    op_type          <name>            the plugin name (TensorRT) and the custom op type (ONNX Runtime)
    plugin_namespace <namespace>       TensorRT's parser reads it before the domain: the plugin is ns::name
    plugin_version   "1"               the version every tensorrt.plugin registers
    plugin_torch_op  "ns::op.overload" the torch op the plugin runs (``register_plugin``'s nodes only)
    plugin_module    "<module>"        the module that defines that op, for a new process (when known)
    <op arguments>   INT/FLOAT/STRING  onnxruntime-extensions reads scalars only, so: bool -> INT 0/1, list ->
                                       STRING holding JSON ("[1, 2]"); TensorRT maps INT -> int32, FLOAT -> float32

Each runtime ignores the attributes it does not declare: ONNX Runtime the ``plugin_*`` ones, TensorRT's parser
every attribute the plugin's creator does not advertise. The graph itself says which torch op each plugin node
runs, so the backends need no process-wide table of plugins, and two converter registries never see each
other's plugins.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from converters.errors import ConversionError

PLUGIN_DOMAIN = "ai.onnx.contrib"
PLUGIN_VERSION = "1"
TORCH_OP_ATTRIBUTE = "plugin_torch_op"
MODULE_ATTRIBUTE = "plugin_module"
#: ``tensorrt.plugin`` refuses these namespaces; these attribute names are its impl's own arguments or ours.
RESERVED_NAMESPACES = frozenset({"", "trt", "tensorrt", "std"})
RESERVED_ATTRIBUTES = frozenset(
    {"outputs", "stream", "tactic", "plugin_namespace", "plugin_version", TORCH_OP_ATTRIBUTE, MODULE_ATTRIBUTE}
)
_INT32 = (-(2**31), 2**31 - 1)


def plugin_node_attributes(attrs: Mapping[str, Any], *, namespace: str, version: str) -> dict[str, Any]:
    """The attributes of a plugin node: ``attrs`` encoded for both runtimes, plus ``plugin_namespace`` and
    ``plugin_version``. bool -> 0/1; int must fit int32 (TensorRT reads INT as int32); a list or tuple -> a JSON
    string; a numpy array -> a native INTS/FLOATS attribute (for C++ plugins; onnxruntime-extensions cannot read
    it)."""
    encoded: dict[str, Any] = {}
    for name, value in attrs.items():
        if name in RESERVED_ATTRIBUTES:
            raise ConversionError(f"plugin attribute name {name!r} is reserved", fix="rename the attribute")
        encoded[name] = _encode(name, value)
    return {**encoded, "plugin_namespace": namespace, "plugin_version": version}


def _encode(name: str, value: Any) -> Any:
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, int | np.integer):
        if not _INT32[0] <= int(value) <= _INT32[1]:
            raise ConversionError(
                f"plugin attribute {name}={value} does not fit int32, which is how TensorRT reads INT attributes",
                fix="pass it as a string, or scale it into int32",
            )
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list | tuple) and all(isinstance(v, bool | int | float | str) for v in value):
        return json.dumps(list(value))
    raise ConversionError(
        f"plugin attribute {name!r} has type {type(value).__name__}",
        fix="use bool, int, float, str, a list of them, or a numpy array",
    )


def plugin_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes of ``model``'s main graph that TensorRT's parser imports as plugins."""
    return [n for n in model.graph.node if any(a.name == "plugin_namespace" for a in n.attribute)]


def node_plugin_id(node: onnx.NodeProto) -> str:
    """``namespace::name`` of a plugin node."""
    namespace = next(a.s.decode() for a in node.attribute if a.name == "plugin_namespace")
    return f"{namespace}::{node.op_type}"


def node_torch_op(node: onnx.NodeProto) -> tuple[str, str | None] | None:
    """The torch op a plugin node runs and the module that defines it (``plugin_torch_op``, ``plugin_module``);
    None for a node not made by ``register_plugin`` (a hand-written plugin)."""
    values = {a.name: a.s.decode() for a in node.attribute if a.name in (TORCH_OP_ATTRIBUTE, MODULE_ATTRIBUTE)}
    if TORCH_OP_ATTRIBUTE not in values:
        return None
    return values[TORCH_OP_ATTRIBUTE], values.get(MODULE_ATTRIBUTE)


def set_node_torch_op(node: onnx.NodeProto, torch_op: str, module: str | None) -> None:
    """Record on a plugin node the torch op it runs (and its module); replaces what it recorded before."""
    kept = [a for a in node.attribute if a.name not in (TORCH_OP_ATTRIBUTE, MODULE_ATTRIBUTE)]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.append(onnx.helper.make_attribute(TORCH_OP_ATTRIBUTE, torch_op))
    if module:
        node.attribute.append(onnx.helper.make_attribute(MODULE_ATTRIBUTE, module))
