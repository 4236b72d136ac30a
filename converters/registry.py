"""The converter registry: per-op entries with validators, priorities and a dynamic-shape flag.

Candidates for a node are tried HIGH first, then STANDARD, each group in registration order; the first whose
validator accepts the node and whose dynamic-shape flag fits is used. Every skipped candidate is logged with the
reason. The registry is an instance, plugins included: ``default_registry()`` builds the default one, tests build
their own, and ``converters.user_registry()`` is the one process-wide registry of ``@converters.register``.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx_graphsurgeon as gs
import torch

from converters.errors import ConversionError
from converters.plugins.spec import PluginSpec, defining_module, plugin_converter, plugin_spec
from converters.settings import Settings
from converters.targets import OpKey, resolve_target

if TYPE_CHECKING:
    from converters.context import ConverterContext

logger = logging.getLogger(__name__)

Validator = Callable[[gs.Node, Settings], bool]
ConverterFunction = Callable[["ConverterContext"], Any]


class Priority(enum.IntEnum):
    """Lower value is tried first."""

    HIGH = 0
    STANDARD = 1


@dataclass(frozen=True)
class ConverterEntry:
    """One registered converter: what it converts, the function, its validator, priority and dynamic-shape support."""

    key: OpKey
    function: ConverterFunction
    validator: Validator | None
    priority: Priority
    supports_dynamic_shapes: bool
    torch_op: torch._ops.OpOverload | None = field(default=None, compare=False)
    order: int = 0

    @property
    def name(self) -> str:
        """The converter function's qualified name, for logs and errors."""
        return getattr(self.function, "__qualname__", repr(self.function))


@dataclass(frozen=True)
class Selection:
    """The entry chosen for a node (or None), and why each candidate before it was skipped."""

    entry: ConverterEntry | None
    skipped: tuple[tuple[ConverterEntry, str], ...]


class ConverterRegistry:
    """Converters by the ONNX node they replace.

    >>> registry = ConverterRegistry()
    >>> @registry.register("Gelu", priority=Priority.HIGH)    # doctest: +SKIP
    ... def gelu(ctx): ...
    """

    def __init__(self) -> None:
        self._entries: dict[OpKey, list[ConverterEntry]] = {}
        self._plugins: dict[str, PluginSpec] = {}
        self._counter = itertools.count()

    def register(
        self,
        target: Any,
        *,
        validator: Validator | None = None,
        priority: Priority = Priority.STANDARD,
        supports_dynamic_shapes: bool = True,
    ) -> Callable[[ConverterFunction], ConverterFunction]:
        """Decorator: register ``function(ctx)`` as a converter for ``target``."""
        key, torch_op = resolve_target(target)

        def add(function: ConverterFunction) -> ConverterFunction:
            existing = self._entries.setdefault(key, [])
            if any(e.function is function for e in existing):
                raise ConversionError(
                    f"{getattr(function, '__qualname__', function)} is already registered for {key}",
                    fix="register a function once per target (remove() it first to re-register)",
                )
            entry = ConverterEntry(
                key, function, validator, Priority(priority), supports_dynamic_shapes, torch_op, next(self._counter)
            )
            existing.append(entry)
            existing.sort(key=lambda e: (e.priority, e.order))
            return function

        return add

    def register_plugin(
        self,
        target: Any,
        *,
        namespace: str | None = None,
        name: str | None = None,
        module: str | None = None,
        priority: Priority = Priority.STANDARD,
    ) -> PluginSpec:
        """Run the torch op ``target`` as a plugin: TensorRT through ``tensorrt.plugin``, ONNX Runtime through an
        onnxruntime-extensions CPU reference, both calling the op's own implementation (README, "Plugins").

        >>> registry.register_plugin("mylib::topk_mask")    # doctest: +SKIP

        ``namespace`` and ``name`` default to the op's (``mylib``, ``topk_mask``; an overload other than
        ``default`` is ``name_overload``). ``module`` is the importable module that defines the op, for loading an
        artifact in a new process; by default the module of the ``@torch.library.custom_op`` function. The spec
        lives in this registry only; another op under the same plugin id here is an error.
        """
        _, op = resolve_target(target)
        if op is None:
            raise ConversionError(
                f"{target!r} is not a torch op; only torch.library ops become plugins",
                fix="pass 'namespace::op' of a torch.library op (import the module that defines it first)",
            )
        spec = plugin_spec(op, namespace=namespace, name=name, module=module or defining_module(op))
        known = self._plugins.get(spec.plugin_id)
        if known is not None and known.op is not spec.op:
            raise ConversionError(
                f"plugin {spec.plugin_id} already runs torch op {known.torch_op}; cannot also run {spec.torch_op}",
                fix="pass another name= (or namespace=) to register_plugin",
            )
        self.register(op, priority=priority)(plugin_converter(spec))
        self._plugins[spec.plugin_id] = spec
        logger.info("torch op %s runs as plugin %s", spec.torch_op, spec.plugin_id)
        return spec

    def plugins(self) -> dict[str, PluginSpec]:
        """The plugins registered here, by plugin id (``namespace::name``)."""
        return dict(self._plugins)

    def remove(self, target: Any, function: ConverterFunction | None = None) -> int:
        """Remove the registrations for ``target`` (only ``function``'s if given), plugins included; returns how
        many."""
        key, op = resolve_target(target)
        entries = self._entries.get(key, [])
        kept = [e for e in entries if function is not None and e.function is not function]
        removed = len(entries) - len(kept)
        if removed == 0:
            raise ConversionError(f"nothing registered for {key} to remove", fix="check the target and the function")
        self._entries[key] = kept
        if not kept:
            self._plugins = {k: spec for k, spec in self._plugins.items() if spec.op is not op}
        return removed

    def include(self, other: ConverterRegistry) -> None:
        """Add every entry and plugin of ``other`` (in its order, after this registry's own at equal priority)."""
        for key in other.op_keys():
            for entry in other.candidates(key):
                if any(e.function is entry.function for e in self._entries.get(key, ())):
                    continue  # already here (included twice)
                self._entries.setdefault(key, []).append(dataclasses.replace(entry, order=next(self._counter)))
                self._entries[key].sort(key=lambda e: (e.priority, e.order))
        for plugin_id, spec in other.plugins().items():
            known = self._plugins.get(plugin_id)
            if known is not None and known.op is not spec.op:
                raise ConversionError(
                    f"plugin {plugin_id} runs torch op {known.torch_op} here and {spec.torch_op} in the registry "
                    "included",
                    fix="pass another name= (or namespace=) to one of the register_plugin calls",
                )
            self._plugins[plugin_id] = spec

    def candidates(self, key: OpKey) -> tuple[ConverterEntry, ...]:
        """The entries registered for ``key``, in the order they are tried."""
        return tuple(self._entries.get(key, ()))

    def torch_ops(self) -> set[torch._ops.OpOverload]:
        """The torch ops with a converter: the exporter writes them as opaque nodes if it cannot translate them."""
        return {e.torch_op for entries in self._entries.values() for e in entries if e.torch_op is not None}

    def op_keys(self) -> Iterator[OpKey]:
        """Every op key with at least one converter."""
        return (k for k, v in self._entries.items() if v)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, OpKey) and bool(self._entries.get(key))

    def select(self, node: gs.Node, key: OpKey, settings: Settings, *, dynamic: bool) -> Selection:
        """The first candidate that accepts ``node``; the reasons the others before it were skipped."""
        skipped: list[tuple[ConverterEntry, str]] = []
        for entry in self.candidates(key):
            reason = _rejection(entry, node, settings, dynamic)
            if reason is None:
                return Selection(entry, tuple(skipped))
            logger.info("converter %s skipped for node %s: %s", entry.name, node.name, reason)
            skipped.append((entry, reason))
        return Selection(None, tuple(skipped))

    def copy(self) -> ConverterRegistry:
        """An independent registry with the same entries and plugins."""
        clone = ConverterRegistry()
        clone._entries = {k: list(v) for k, v in self._entries.items()}
        clone._plugins = dict(self._plugins)
        clone._counter = itertools.count(next(self._counter))
        return clone


def _rejection(entry: ConverterEntry, node: gs.Node, settings: Settings, dynamic: bool) -> str | None:
    if dynamic and not entry.supports_dynamic_shapes:
        return "its inputs have dynamic dimensions and it declares supports_dynamic_shapes=False"
    if entry.validator is None:
        return None
    try:
        accepted = entry.validator(node, settings)
    except Exception as exc:
        raise ConversionError(
            f"the validator of converter {entry.name} raised {type(exc).__name__}: {exc}",
            node=node.name,
            fix="a validator must return True or False for any node of its op",
        ) from exc
    return None if accepted else "its validator rejected the node"
