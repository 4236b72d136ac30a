"""Plugins: a ``torch.library`` op that runs as one node, inside TensorRT and on ONNX Runtime, from the same code.

``registry.register_plugin("mylib::op")`` (or ``converters.register_plugin("mylib::op")`` for the process-wide
user registry) registers a converter that replaces the op's opaque node by a *plugin node*
(:mod:`converters.plugins.nodes`), made from the op's :class:`PluginSpec`. The spec lives in that registry; the node
records the torch op it runs, and the backends re-create the spec from the node (:func:`spec_for_node`):
``pipeline.runtime.plugins`` registers a ``tensorrt.plugin`` (Quickly Deployable Plugin) before TensorRT
parses the graph, and an onnxruntime-extensions CPU reference before ONNX Runtime loads it; both call the op itself.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch

from converters.errors import ArtifactError, ConversionError
from converters.plugins.nodes import (
    MODULE_ATTRIBUTE,
    PLUGIN_VERSION,
    RESERVED_ATTRIBUTES,
    RESERVED_NAMESPACES,
    TORCH_OP_ATTRIBUTE,
    node_plugin_id,
    node_torch_op,
    plugin_nodes,
    set_node_torch_op,
)

if TYPE_CHECKING:
    from converters.context import ConverterContext

logger = logging.getLogger(__name__)

#: torch schema type -> attribute kind. Lists travel as JSON strings; bools as INT 0/1.
_KINDS = {
    "int": "int",
    "SymInt": "int",
    "float": "float",
    "bool": "bool",
    "str": "str",
    "List[int]": "int[]",
    "List[SymInt]": "int[]",
    "List[float]": "float[]",
    "List[bool]": "bool[]",
    "List[str]": "str[]",
}
_SCALARS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": bool, "str": str}


@dataclass(frozen=True)
class PluginSpec:
    """How a torch op becomes the plugin ``namespace::name``: its tensor arguments (the node's inputs, in order),
    its other arguments with their kind (``int``, ``float``, ``bool``, ``str``, or a list ``int[]`` ...), its output
    count, and the module that defines the op (so a new process can import it)."""

    op: torch._ops.OpOverload
    namespace: str
    name: str
    tensor_args: tuple[str, ...]
    attributes: tuple[tuple[str, str], ...]
    num_outputs: int
    module: str | None = None
    version: str = PLUGIN_VERSION

    @property
    def plugin_id(self) -> str:
        """``namespace::name``, the plugin's id in TensorRT's plugin registry."""
        return f"{self.namespace}::{self.name}"

    @property
    def torch_op(self) -> str:
        """The torch op overload the plugin runs, as ``namespace::name.overload``."""
        return f"{self.op._schema.name}.{self.op._overloadname}"

    def node_attributes(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The op's argument values (``ctx.attrs``) as the Python values ``ctx.plugin`` encodes."""
        missing = [name for name, _ in self.attributes if values.get(name) is None]
        if missing:
            raise ConversionError(
                f"plugin {self.plugin_id}: no value for argument(s) {', '.join(missing)}",
                fix="pass every non-tensor argument of the op (plugins take no optional arguments)",
            )
        return {name: _coerce(kind, values[name]) for name, kind in self.attributes}

    def decode(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Attribute values as a runtime hands them over (ints, floats, strings) -> the op's own arguments."""
        decoded = {}
        for name, kind in self.attributes:
            value = raw[name]
            if kind.endswith("[]") or kind == "str":
                value = _text(value)
            decoded[name] = _coerce(kind, json.loads(value) if kind.endswith("[]") else value)
        return decoded

    def call(self, tensors: Sequence[torch.Tensor], attrs: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
        """Run the op on ``tensors`` (in ``tensor_args`` order) with decoded ``attrs``; always a tuple."""
        given = dict(zip(self.tensor_args, tensors, strict=True)) | dict(attrs)
        with torch.no_grad():
            result = self.op(*(given[a.name] for a in self.op._schema.arguments))
        return tuple(result) if isinstance(result, tuple | list) else (result,)

    def source_attributes(self) -> dict[str, str]:
        """The node attributes that say which torch op the plugin runs (see :mod:`converters.plugins.nodes`)."""
        return {TORCH_OP_ATTRIBUTE: self.torch_op, **({MODULE_ATTRIBUTE: self.module} if self.module else {})}

    def record(self) -> dict[str, str | None]:
        """What an artifact stores to re-create this spec in another process (:func:`restore_plugins`)."""
        return {"plugin": self.plugin_id, "version": self.version, "torch_op": self.torch_op, "module": self.module}


def _coerce(kind: str, value: Any) -> Any:
    if kind.endswith("[]"):
        return [_SCALARS[kind[:-2]](v) for v in value]
    if isinstance(value, np.ndarray):  # tensorrt.plugin hands numbers over as one-element arrays
        value = value.reshape(-1)[0].item()
    return _SCALARS[kind](value)


def _text(value: Any) -> str:
    # TensorRT's parser copies STRING attributes as NUL-terminated char fields; never let the NUL reach the op.
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text.rstrip("\x00")


# -- the spec of an op -----------------------------------------------------------------------------------------


def plugin_spec(
    op: torch._ops.OpOverload, *, namespace: str | None = None, name: str | None = None, module: str | None = None
) -> PluginSpec:
    """The spec of ``op`` as a plugin; an op whose schema cannot be a plugin is a ConversionError saying why."""
    schema = op._schema
    op_namespace, _, op_name = schema.name.partition("::")
    namespace = op_namespace if namespace is None else namespace
    if name is None:
        name = op_name if op._overloadname == "default" else f"{op_name}_{op._overloadname}"
    where = f"torch op {schema.name}"
    if namespace in RESERVED_NAMESPACES or "." in namespace or "." in name or not name:
        raise ConversionError(
            f"{where}: {namespace}::{name} cannot name a tensorrt.plugin (no '.', namespace not one of "
            f"{sorted(RESERVED_NAMESPACES)})",
            fix="pass namespace= and name= to register_plugin",
        )
    if schema.is_mutable:
        raise ConversionError(f"{where} mutates its inputs", fix="plugins must be functional: mutates_args=()")
    bad_returns = [str(r.type) for r in schema.returns if str(r.type) != "Tensor"]
    if bad_returns or not schema.returns:
        raise ConversionError(
            f"{where} returns {bad_returns or 'nothing'}", fix="return one Tensor or a tuple of Tensors"
        )
    tensors: list[str] = []
    attributes: list[tuple[str, str]] = []
    for arg in schema.arguments:
        type_text = str(arg.type)
        if type_text == "Tensor":
            if attributes:
                raise ConversionError(
                    f"{where}: tensor argument {arg.name!r} comes after a non-tensor argument",
                    fix="put the op's tensor arguments first (tensorrt.plugin takes tensors, then attributes)",
                )
            tensors.append(arg.name)
        elif type_text in _KINDS and arg.name not in RESERVED_ATTRIBUTES:
            attributes.append((arg.name, _KINDS[type_text]))
        else:
            raise ConversionError(
                f"{where}: argument {arg.name!r} ({type_text}) cannot be a plugin "
                + ("attribute name" if arg.name in RESERVED_ATTRIBUTES else "input or attribute"),
                fix="plugins take Tensor inputs and int, float, bool, str (or lists of them) arguments, none "
                f"optional, none named {', '.join(sorted(RESERVED_ATTRIBUTES))}",
            )
    if not tensors:
        raise ConversionError(f"{where} has no tensor argument", fix="a plugin needs at least one tensor input")
    return PluginSpec(op, namespace, name, tuple(tensors), tuple(attributes), len(schema.returns), module)


def defining_module(op: torch._ops.OpOverload) -> str | None:
    """The module of the function that defined ``op`` with ``@torch.library.custom_op``, when torch knows it."""
    try:  # a private table of torch; without it the caller passes module= to register_plugin
        from torch._library.custom_ops import OPDEFS

        definition = OPDEFS.get(op._schema.name)
    except Exception:  # pragma: no cover - depends on the torch version
        return None
    return getattr(getattr(definition, "_init_fn", None), "__module__", None)


def plugin_converter(spec: PluginSpec) -> Callable[[ConverterContext], list[gs.Tensor]]:
    """The converter ``register_plugin`` registers: the op's opaque node -> one plugin node running ``spec``."""

    def convert(ctx: ConverterContext) -> list[gs.Tensor]:
        inputs = [ctx.input(name) for name in spec.tensor_args]
        attrs = spec.node_attributes(ctx.attrs)
        result = ctx.plugin(
            spec.name, inputs, attrs, namespace=spec.namespace, version=spec.version, outputs=spec.num_outputs
        )
        outputs: list[gs.Tensor] = result if isinstance(result, list) else [result]
        outputs[0].inputs[0].attrs.update(spec.source_attributes())  # the node says which op it runs
        # the replaced node's outputs keep their dtypes and (symbolic) shapes, which the exporter took from the
        # op's fake kernel; the ONNX Runtime executor reads the dtypes to register the CPU reference
        return outputs

    convert.__qualname__ = convert.__name__ = f"plugin[{spec.plugin_id}]"
    return convert


# -- the node -------------------------------------------------------------------------------------------------------


def spec_for_node(node: onnx.NodeProto) -> PluginSpec | None:
    """The spec of the torch op a plugin node runs (imported from its module when not defined yet); None for a
    hand-written plugin node, which records no torch op."""
    source = node_torch_op(node)
    if source is None:
        return None
    torch_op, module = source
    namespace, _, name = node_plugin_id(node).partition("::")
    return plugin_spec(import_op(torch_op, module), namespace=namespace, name=name, module=module)


# -- artifacts ------------------------------------------------------------------------------------------------------


def plugin_records(model: onnx.ModelProto) -> list[dict[str, str | None]]:
    """One record per plugin ``model`` uses, from its nodes: what an artifact's metadata lists. A plugin node not
    made by ``register_plugin`` (a C++ plugin) is recorded without a torch op: its library must be loaded by hand."""
    records: dict[str, dict[str, str | None]] = {}
    for node in plugin_nodes(model):
        plugin_id = node_plugin_id(node)
        source = node_torch_op(node)
        version = next((a.s.decode() for a in node.attribute if a.name == "plugin_version"), None)
        records[plugin_id] = {
            "plugin": plugin_id,
            "version": version if source else None,
            "torch_op": source[0] if source else None,
            "module": source[1] if source else None,
        }
    return list(records.values())


def restore_plugins(records: Sequence[Mapping[str, Any]], model: onnx.ModelProto) -> list[PluginSpec]:
    """The plugin specs an artifact recorded, importing the module that defines each op if needed. A plugin node
    of ``model`` that does not record its torch op (an artifact written before nodes did) is given it."""
    specs = []
    nodes = plugin_nodes(model)
    for record in records:
        if not record.get("torch_op"):
            logger.info("plugin %s is not a torch op: load its plugin library yourself", record.get("plugin"))
            continue
        torch_op, module = str(record["torch_op"]), record.get("module")
        namespace, _, name = str(record["plugin"]).partition("::")
        spec = plugin_spec(import_op(torch_op, module), namespace=namespace, name=name, module=module)
        for node in nodes:
            if node_plugin_id(node) == spec.plugin_id and node_torch_op(node) is None:
                set_node_torch_op(node, torch_op, module)
        specs.append(spec)
    return specs


def import_op(qualified: str, module: str | None) -> torch._ops.OpOverload:
    """``mylib::op.default`` as an OpOverload, importing ``module`` first when the op is not defined yet."""
    op = _lookup(qualified)
    if op is None and module and module != "__main__":
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ArtifactError(
                f"cannot import {module}, which defines the plugin op {qualified}: {exc}",
                fix=f"make {module} importable (install it or add it to sys.path) before pipeline.load",
            ) from exc
        op = _lookup(qualified)
    if op is None:
        raise ArtifactError(
            f"the artifact runs torch op {qualified} as a plugin, and no module defines it here"
            + (f" ({module} does not)" if module and module != "__main__" else ""),
            fix="import the module that defines the op before pipeline.load, or define the op in an importable "
            "module (not a script's __main__) and pass module= to register_plugin",
        )
    return op


def _lookup(qualified: str) -> torch._ops.OpOverload | None:
    namespace, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except (AttributeError, RuntimeError):
        return None
