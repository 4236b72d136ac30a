"""Plugins: a ``torch.library`` op that runs as one node, inside TensorRT and on ONNX Runtime, from the same code.

``register_plugin("mylib::op", registry=registry)`` registers a converter that replaces the op's opaque node by a
*plugin node*, and remembers how the op becomes a plugin (:class:`PluginSpec`). The backends read that spec:
``pipeline.backends.plugin_runtime`` registers a ``tensorrt.plugin`` (Quickly Deployable Plugin) before TensorRT
parses the graph, and an onnxruntime-extensions CPU reference before ONNX Runtime loads it; both call the op itself.

One node serves both runtimes (TRT_REFERENCE 4.2, 4.4)::

    domain           ai.onnx.contrib   onnxruntime-extensions finds Python ops in this domain only
    op_type          <name>            the plugin name (TensorRT) and the custom op type (ONNX Runtime)
    plugin_namespace <namespace>       TensorRT's parser reads it before the domain: the plugin is ns::name
    plugin_version   "1"               the version every tensorrt.plugin registers
    <op arguments>   INT/FLOAT/STRING  onnxruntime-extensions reads scalars only, so: bool -> INT 0/1, list ->
                                       STRING holding JSON ("[1, 2]"); TensorRT maps INT -> int32, FLOAT -> float32

Each runtime ignores the attributes it does not declare: ONNX Runtime the two ``plugin_*`` ones, TensorRT's
parser every attribute the plugin's creator does not advertise.
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
from converters.registry import ConverterRegistry, Priority
from converters.targets import resolve_target

if TYPE_CHECKING:
    from converters.context import ConverterContext

logger = logging.getLogger(__name__)

PLUGIN_DOMAIN = "ai.onnx.contrib"
PLUGIN_VERSION = "1"
#: ``tensorrt.plugin`` refuses these namespaces and these attribute names (they are its impl's own arguments).
RESERVED_NAMESPACES = frozenset({"", "trt", "tensorrt", "std"})
RESERVED_ATTRIBUTES = frozenset({"outputs", "stream", "tactic", "plugin_namespace", "plugin_version"})
_INT32 = (-(2**31), 2**31 - 1)

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
        return f"{self.namespace}::{self.name}"

    @property
    def torch_op(self) -> str:
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


# -- registration ---------------------------------------------------------------------------------------------------

#: Plugin id -> spec, for this process. TensorRT's plugin registry and onnxruntime-extensions' op list are
#: process-wide too; the backends look plugin nodes up here.
_SPECS: dict[str, PluginSpec] = {}


def register_plugin(
    target: Any,
    *,
    registry: ConverterRegistry,
    namespace: str | None = None,
    name: str | None = None,
    module: str | None = None,
    priority: Priority = Priority.STANDARD,
) -> PluginSpec:
    """Run the torch op ``target`` as a plugin: TensorRT through ``tensorrt.plugin``, ONNX Runtime through an
    onnxruntime-extensions CPU reference, both calling the op's own implementation.

    >>> converters.register_plugin("mylib::topk_mask", registry=registry)    # doctest: +SKIP

    ``namespace`` and ``name`` default to the op's (``mylib``, ``topk_mask``; an overload other than ``default``
    is ``name_overload``). ``module`` is the importable module that defines the op, for loading an artifact in a
    new process; by default the module of the ``@torch.library.custom_op`` function.
    """
    _, op = resolve_target(target)
    if op is None:
        raise ConversionError(
            f"{target!r} is not a torch op; only torch.library ops become plugins",
            fix="pass 'namespace::op' of a torch.library op (import the module that defines it first)",
        )
    spec = plugin_spec(op, namespace=namespace, name=name, module=module or defining_module(op))
    remember(spec)
    registry.register(op, priority=priority)(_plugin_converter(spec))
    logger.info("torch op %s runs as plugin %s", spec.torch_op, spec.plugin_id)
    return spec


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


def remember(spec: PluginSpec) -> None:
    """Make ``spec`` the plugin for its id in this process; another op already under that id is an error."""
    known = _SPECS.get(spec.plugin_id)
    if known is not None and known.op is not spec.op:
        raise ConversionError(
            f"plugin {spec.plugin_id} already runs torch op {known.torch_op}; cannot also run {spec.torch_op}",
            fix="pass another name= (or namespace=) to register_plugin",
        )
    _SPECS[spec.plugin_id] = spec


def find_plugin(plugin_id: str) -> PluginSpec | None:
    """The spec registered in this process for ``namespace::name``, if any."""
    return _SPECS.get(plugin_id)


def defining_module(op: torch._ops.OpOverload) -> str | None:
    """The module of the function that defined ``op`` with ``@torch.library.custom_op``, when torch knows it."""
    try:  # a private table of torch; without it the caller passes module= to register_plugin
        from torch._library.custom_ops import OPDEFS

        definition = OPDEFS.get(op._schema.name)
    except Exception:  # pragma: no cover - depends on the torch version
        return None
    return getattr(getattr(definition, "_init_fn", None), "__module__", None)


def _plugin_converter(spec: PluginSpec) -> Callable[[ConverterContext], list[gs.Tensor]]:
    def convert(ctx: ConverterContext) -> list[gs.Tensor]:
        inputs = [ctx.input(name) for name in spec.tensor_args]
        attrs = spec.node_attributes(ctx.attrs)
        result = ctx.plugin(
            spec.name, inputs, attrs, namespace=spec.namespace, version=spec.version, outputs=spec.num_outputs
        )
        # the replaced node's outputs keep their dtypes and (symbolic) shapes, which the exporter took from the
        # op's fake kernel; the ONNX Runtime executor reads the dtypes to register the CPU reference
        return result if isinstance(result, list) else [result]

    convert.__qualname__ = convert.__name__ = f"plugin[{spec.plugin_id}]"
    return convert


# -- the node -------------------------------------------------------------------------------------------------------


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
    namespace = next(a.s.decode() for a in node.attribute if a.name == "plugin_namespace")
    return f"{namespace}::{node.op_type}"


# -- artifacts ------------------------------------------------------------------------------------------------------


def plugin_records(model: onnx.ModelProto) -> list[dict[str, str | None]]:
    """One record per plugin ``model`` uses: what ``restore_plugins`` needs in a new process. A plugin node not
    made by ``register_plugin`` (a C++ plugin) is recorded without a torch op: its library must be loaded by hand."""
    records: dict[str, dict[str, str | None]] = {}
    for node in plugin_nodes(model):
        plugin_id = node_plugin_id(node)
        spec = find_plugin(plugin_id)
        records[plugin_id] = (
            spec.record() if spec else {"plugin": plugin_id, "version": None, "torch_op": None, "module": None}
        )
    return list(records.values())


def restore_plugins(records: Sequence[Mapping[str, Any]]) -> list[PluginSpec]:
    """Re-create the plugin specs an artifact recorded, importing the module that defines each op if needed."""
    specs = []
    for record in records:
        if not record.get("torch_op"):
            logger.info("plugin %s is not a torch op: load its plugin library yourself", record.get("plugin"))
            continue
        namespace, _, name = str(record["plugin"]).partition("::")
        op = _import_op(str(record["torch_op"]), record.get("module"))
        spec = plugin_spec(op, namespace=namespace, name=name, module=record.get("module"))
        remember(spec)
        specs.append(spec)
    return specs


def _import_op(qualified: str, module: str | None) -> torch._ops.OpOverload:
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
