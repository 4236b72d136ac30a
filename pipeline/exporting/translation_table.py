"""The exporter's table of ONNX translations, built once per process instead of once per export.

``torch.onnx.export`` builds its registry of ATen translations (``ONNXRegistry.from_torchlib``) on every call: it
reads the source of about 500 onnxscript functions and derives their signatures, which takes about 2 s, most of
the export of a small model (measured on torch 2.13: 2.1 s of 3.3 s per export of a one-op module). The table
depends only on the opset and on which torch operators exist, so :func:`reused_translation_table` keeps one per
opset, rebuilt when the process registers operators (the dispatcher's operator count changes, e.g. torchvision
imported later), and gives each export its own copy of the lists: ``custom_translation_table`` entries are
inserted into the copy, never into the kept table. Their descriptions (the signature the exporter derives from each
function's type hints) are kept too, by (op, function): every op with a converter has an entry on every export.

It patches a private class of the exporter for the duration of the ``with`` block. On a torch whose exporter has
no such class, nothing is patched and every export builds its own table, as before (slower, same graph).

The kept table also holds the translations the exporter lacks (:func:`missing_translations`: ``aten.sym_numel``,
which a model's ``tensor.numel()`` over a dynamic shape leaves in the program), each only where the exporter has none.
"""

from __future__ import annotations

import copy
import importlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_LOCK = threading.Lock()
_KEPT: dict[int, tuple[int, Any]] = {}  # opset -> (operator count, the registry as from_torchlib built it)
_DESCRIBED: dict[tuple[Any, Any, bool], Any] = {}  # (op, translation, complex) -> the exporter's description of it
_PATCHED: dict[str, Any] = {}  # the registry's own methods while patched (and the patch of register_op)
_OPEN = [0]  # reused_translation_table blocks open
_MOST_DESCRIBED = 4096  # descriptions kept at most (ours are ~150)


def _registry_class() -> Any:
    try:
        registration = importlib.import_module("torch.onnx._internal.exporter._registration")
    except ImportError:
        return None
    registry = getattr(registration, "ONNXRegistry", None)
    if registry is None or not isinstance(registry.__dict__.get("from_torchlib"), classmethod):
        return None
    return registry


def _operator_count() -> int:
    return len(torch._C._dispatch_get_all_op_names())


@contextmanager
def listed_without_parsing() -> Iterator[None]:
    """While the table is built, onnxscript lists its ATen functions without parsing their source again.

    onnxscript's ``get_torchlib_ops`` reads each function's domain from ``function.function_ir``, which, for the
    ~300 traced functions, reads and parses the function's source to build its signature (0.7 of the table's 1.3 s).
    The domain is the function's opset's domain (checked for every function of onnxscript 0.7: all 557 agree), so
    the same list is made from ``function.opset.domain``. Where onnxscript lists them otherwise, nothing changes."""
    try:
        lazy = importlib.import_module("torch.onnx._internal._lazy_import")
        apis: Any = importlib.import_module(lazy.onnxscript_apis._name)  # the module the exporter lists them from
        listing = importlib.import_module(apis.get_torchlib_ops.__module__)
        meta = listing._OnnxFunctionMeta
        registration = importlib.import_module("onnxscript.function_libs.torch_lib.registration")
    except (ImportError, AttributeError):
        yield
        return

    def get_torchlib_ops() -> list[Any]:
        importlib.import_module("onnxscript.function_libs.torch_lib.ops")  # registers the functions
        return [
            meta(qualified_name=name, function=f, domain=f.opset.domain, name=f.name, is_complex=is_complex)
            for name, functions in registration.default_registry.items()
            if not name.startswith("internal::")
            for is_complex, group in ((False, functions.overloads), (True, functions.complex))
            for f in group
        ]

    original = apis.get_torchlib_ops
    apis.get_torchlib_ops = get_torchlib_ops
    try:
        yield
    finally:
        apis.get_torchlib_ops = original


def missing_translations() -> dict[Any, Any]:
    """ONNX translations of ATen operators the exporter's table lacks (torch 2.13, onnxscript 0.7), by operator.

    ``aten.sym_numel`` (``tensor.numel()`` of a tensor whose shape is dynamic: Inkling 2's) is the product of the
    tensor's shape, an int64 scalar, as ``aten.sym_size.int`` is one of its dimensions."""
    from onnxscript import INT64
    from onnxscript.function_libs.torch_lib.tensor_typing import TTensor
    from onnxscript.onnx_opset import opset18 as op

    def aten_sym_numel(self: TTensor) -> INT64:
        """sym_numel(Tensor self) -> SymInt"""
        return op.ReduceProd(op.Shape(self), keepdims=0)  # type: ignore[type-var]

    # the exporter reads the signature from the hints, which this module's postponed annotations leave as names
    aten_sym_numel.__annotations__ = {"self": TTensor, "return": INT64}
    return {torch.ops.aten.sym_numel.default: aten_sym_numel}


def _add_missing(table: Any) -> None:
    """Register in ``table`` each of :func:`missing_translations` it has none for (with the exporter's own
    ``register_op``: this runs under the lock the patched one takes)."""
    register = _PATCHED.get("original_register_op") or type(table).register_op
    for target, function in missing_translations().items():
        if not table.is_registered(target):
            register(table, target, function)


def _copy(kept: Any) -> Any:
    fresh = copy.copy(kept)
    fresh.functions = {target: list(decompositions) for target, decompositions in kept.functions.items()}
    return fresh


@contextmanager
def reused_translation_table() -> Iterator[None]:
    """Within the block, ``torch.onnx.export`` takes a copy of a kept translation table instead of building one.
    Blocks may overlap (exports in threads): the first to open patches the exporter's registry, the last to close
    restores the originals it found."""
    registry = _registry_class()
    if registry is None:
        yield
        return
    with _LOCK:
        if not _PATCHED:
            _PATCHED.update(from_torchlib=registry.__dict__["from_torchlib"], register_op=_described(registry))
            registry.from_torchlib = classmethod(_kept_from_torchlib(_PATCHED["from_torchlib"].__func__))
            if _PATCHED["register_op"] is not None:
                _PATCHED["original_register_op"] = registry.__dict__["register_op"]
                registry.register_op = _PATCHED["register_op"]
        _OPEN[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _OPEN[0] -= 1
            if _OPEN[0] == 0:
                registry.from_torchlib = _PATCHED["from_torchlib"]
                if "original_register_op" in _PATCHED:
                    registry.register_op = _PATCHED["original_register_op"]
                _PATCHED.clear()


def _kept_from_torchlib(build: Any) -> Any:
    """``from_torchlib`` giving a copy of the table kept for the opset (built by ``build``, the exporter's own, when
    none is kept or operators were registered since)."""

    def from_torchlib(cls: type, opset_version: int | None = None) -> Any:
        if opset_version is None:
            built = build(cls)
            _add_missing(built)
            return built
        count = _operator_count()
        with _LOCK:
            kept_count, kept = _KEPT.get(opset_version, (-1, None))
            if kept_count != count or type(kept) is not cls:
                with listed_without_parsing():
                    kept = build(cls, opset_version=opset_version)
                _add_missing(kept)
                _KEPT[opset_version] = (count, kept)
            return _copy(kept)

    return from_torchlib


def _described(registry: type) -> Any:
    """``register_op`` keeping each (op, translation) pair's description: the exporter registers every entry of
    ``custom_translation_table`` on every export, deriving its signature from the function's type hints (0.5 ms
    each, 60-70 ms per export of a model: every op with a converter has an entry, and :func:`~converters.custom_ops.
    opaque_translation` gives each op the same function each time). None where the exporter's registry registers
    otherwise (nothing patched)."""
    try:
        registration = importlib.import_module("torch.onnx._internal.exporter._registration")
        meta, register = registration.OnnxDecompMeta, registry.__dict__["register_op"]
    except (ImportError, AttributeError, KeyError):
        return None
    if not callable(getattr(registry, "_register", None)) or not callable(register):
        return None

    def register_op(self: Any, target: Any, function: Any, is_complex: bool = False) -> None:
        if isinstance(target, torch._ops.OpOverloadPacket) or not _hashable(target, function):
            return register(self, target, function, is_complex)
        key = (target, function, is_complex)
        with _LOCK:
            description = _DESCRIBED.get(key)
            if description is None:
                description = meta(
                    onnx_function=function, fx_target=target, signature=None, is_custom=True, is_complex=is_complex
                )
                if len(_DESCRIBED) >= _MOST_DESCRIBED:  # a caller's fresh functions on every export: not kept forever
                    _DESCRIBED.clear()
                _DESCRIBED[key] = description
        self._register(target, description)

    return register_op


def _hashable(*values: Any) -> bool:
    try:
        hash(values)
    except TypeError:
        return False
    return True


def kept_tables() -> dict[int, int]:
    """The opsets whose table this process keeps, each with the operator count it was built at (for tests and
    diagnostics)."""
    with _LOCK:
        return {opset: count for opset, (count, _) in _KEPT.items()}


def forget_tables() -> None:
    """Drop the kept tables: the next export builds its own, as every export did before (for benchmarks)."""
    with _LOCK:
        _KEPT.clear()
        _DESCRIBED.clear()
