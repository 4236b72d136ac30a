"""The one process-wide *user* registry: ``@converters.register`` and ``converters.register_plugin``.

What torch2trt's ``@tensorrt_converter`` and Torch-TensorRT's ``@dynamo_tensorrt_converter`` users expect: a
converter registered at module level, next to the op, is used by ``pipeline.convert(model, sample)`` with no
extra argument, because :func:`converters.default_registry` includes this registry (its entries are tried before
the built-ins at equal priority). An explicit ``convert(..., converters=registry)`` uses that registry alone.
Everything else builds its own :class:`ConverterRegistry`; this is the one concession to module-level decorators.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from converters.plugins.spec import PluginSpec
from converters.registry import ConverterFunction, ConverterRegistry, Priority, Validator

_USER_REGISTRY = ConverterRegistry()  # empty until user code registers: nothing here registers on import


def user_registry() -> ConverterRegistry:
    """The process-wide user registry that ``register`` and ``register_plugin`` add to (``.remove`` undoes)."""
    return _USER_REGISTRY


def register(
    target: Any,
    *,
    validator: Validator | None = None,
    priority: Priority = Priority.STANDARD,
    supports_dynamic_shapes: bool = True,
) -> Callable[[ConverterFunction], ConverterFunction]:
    """Decorator: register ``function(ctx)`` in the user registry as a converter for ``target``; ``pipeline.convert``
    uses it unless given ``converters=``. The arguments are :meth:`ConverterRegistry.register`'s.

    >>> @converters.register("mylib::shifted_relu")             # doctest: +SKIP
    ... def convert_shifted_relu(ctx): ...
    """
    return _USER_REGISTRY.register(
        target, validator=validator, priority=priority, supports_dynamic_shapes=supports_dynamic_shapes
    )


def register_plugin(
    target: Any,
    *,
    registry: ConverterRegistry | None = None,
    namespace: str | None = None,
    name: str | None = None,
    module: str | None = None,
    priority: Priority = Priority.STANDARD,
) -> PluginSpec:
    """Run the torch op ``target`` as a plugin (:meth:`ConverterRegistry.register_plugin`), registered in
    ``registry``, by default the user registry (so ``pipeline.convert`` uses it with no extra argument).

    >>> converters.register_plugin("mylib::topk_mask")                      # doctest: +SKIP
    >>> converters.register_plugin("mylib::topk_mask", registry=registry)   # doctest: +SKIP
    """
    chosen = _USER_REGISTRY if registry is None else registry
    return chosen.register_plugin(target, namespace=namespace, name=name, module=module, priority=priority)
