"""The containers a model takes and returns, flattened, named and saved so that they come back as their own types.

torch's pytree flattens tuples, lists, dicts, namedtuples, structseqs (``torch.return_types.max``) and every
registered type (transformers' ``ModelOutput``, diffusers' ``BaseOutput``, ``register_dataclass``), but:

- it can name the leaves (``tree_flatten_with_path``) only of types registered with a ``flatten_with_keys_fn``,
  which diffusers' outputs are not: :func:`flatten_with_paths` derives the keys from the tree spec instead;
- it treats a dataclass nobody registered as a leaf: :func:`register_dataclasses` registers the ones in a result
  (``torch.utils._pytree.register_dataclass``) so that they are traced, flattened and rebuilt like any other;
- it can save (``treespec_dumps``) only types with a serialised name and JSON context: namedtuples, structseqs and
  dataclasses without one are written here as tuples whose JSON ``type`` names their class
  (``python.namedtuple:module:Name``, ``torch.return_types.max``), and :func:`loads` imports that class again.

Anything else that is neither a tensor nor a plain value is an error that names its type and how to register it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from converters.errors import ArtifactError, ExportError

logger = logging.getLogger(__name__)

_RETURN_TYPES = "torch.return_types."
_NAMEDTUPLE = "python.namedtuple:"
_DATACLASS = "python.dataclass:"

KeyPath = tuple[Any, ...]


# -- flattening ----------------------------------------------------------------------------------------------------


def register_dataclasses(tree: Any) -> list[type]:
    """Register, as pytree nodes, the dataclass types in ``tree`` that nobody registered (nested ones too); the
    types registered are returned (and logged). A registered dataclass is traced by ``torch.export`` and comes back
    from the converted module as its own type.

    >>> @dataclasses.dataclass
    ... class Out:
    ...     image: torch.Tensor
    >>> [cls.__name__ for cls in register_dataclasses(Out(torch.ones(1)))]
    ['Out']
    """
    added: list[type] = []
    while True:
        fresh = {
            type(leaf)
            for leaf in pytree.tree_leaves(tree)
            if _is_dataclass_instance(leaf) and type(leaf) not in pytree.SUPPORTED_NODES
        }
        if not fresh:
            return added
        for cls in sorted(fresh, key=_qualified):
            pytree.register_dataclass(cls)
            logger.info("registered the dataclass %s as a pytree node (its fields are traced)", _qualified(cls))
            added.append(cls)


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def flatten_with_paths(tree: Any) -> tuple[list[tuple[KeyPath, Any]], pytree.TreeSpec]:
    """``pytree.tree_flatten_with_path(tree)``, also for types registered without a ``flatten_with_keys_fn``
    (diffusers' outputs): their keys come from the node's context (the field or dict keys), else positions."""
    try:
        return pytree.tree_flatten_with_path(tree)
    except ValueError:  # "Did not find a flatten_with_keys_fn for type ..."
        leaves, spec = pytree.tree_flatten(tree)
        return list(zip(_key_paths(spec), leaves, strict=True)), spec


def _key_paths(node: pytree.TreeSpec, prefix: KeyPath = ()) -> list[KeyPath]:
    if node.is_leaf():
        return [prefix]
    children = _children(node)
    paths: list[KeyPath] = []
    for key, child in zip(_child_keys(node, len(children)), children, strict=True):
        paths += _key_paths(child, (*prefix, key))
    return paths


def _child_keys(node: pytree.TreeSpec, count: int) -> list[Any]:
    context = node.context
    if isinstance(context, type) and hasattr(context, "_fields"):  # a namedtuple: context is its class
        return [pytree.GetAttrKey(name) for name in context._fields]
    if _names(context, count):  # dict-style (diffusers' BaseOutput, OrderedDict)
        return [pytree.MappingKey(name) for name in context]
    if isinstance(context, list | tuple) and len(context) == 2 and _names(context[0], count):  # register_dataclass
        return [pytree.GetAttrKey(name) for name in context[0]]
    return [pytree.SequenceKey(i) for i in range(count)]


def _names(context: Any, count: int) -> bool:
    return isinstance(context, list | tuple) and len(context) == count and all(isinstance(k, str) for k in context)


def unknown_container_error(path: KeyPath, leaf: Any) -> ExportError:
    """The error for a result leaf that is neither a tensor nor None: its type named, and how to make it a
    container (register it) or a tensor."""
    where = pytree.keystr(path) or "(result)"
    cls = type(leaf)
    if isinstance(leaf, bool | int | float | str | bytes):
        return ExportError(
            f"output {where} is a {cls.__name__}; only tensors (and None) can be graph outputs",
            fix="return tensors from forward(), e.g. torch.tensor(value) instead of a Python number",
        )
    return ExportError(
        f"output {where} is a {_qualified(cls)}, a container torch's pytree does not know, so its contents cannot "
        "be graph outputs",
        fix=f"register it before converting: torch.utils._pytree.register_pytree_node({cls.__name__}, flatten, "
        f"unflatten, serialized_type_name='{_qualified(cls)}') (or register_dataclass for a dataclass-like class), "
        "or return a tuple/dict of tensors",
    )


# -- saving and loading --------------------------------------------------------------------------------------------


def dumps(tree: pytree.TreeSpec) -> str:
    """``pytree.treespec_dumps(tree)``, with namedtuples, structseqs and dataclasses without a serialised name
    recorded by their class; any other type torch cannot save is an ExportError naming it.

    >>> _, tree = pytree.tree_flatten(torch.max(torch.ones(2, 3), 1))
    >>> loads(dumps(tree)) == tree
    True
    """
    plain = _replace(tree, lambda node: (tuple, None) if _marker(node) else None)
    unsaveable = _unsaveable(plain)
    if unsaveable is not None:
        raise ExportError(
            f"the structure holds a {_qualified(unsaveable)}, registered with torch's pytree without a serialized "
            "name, so the converted module could not rebuild it after loading",
            fix=f"register {unsaveable.__name__} with serialized_type_name='{_qualified(unsaveable)}' (and a "
            "JSON-able context), or return a tuple/dict of tensors",
        )
    protocol, schema = json.loads(pytree.treespec_dumps(plain))
    _write_markers(tree, schema)
    return json.dumps([protocol, schema])


def loads(text: str) -> pytree.TreeSpec:
    """The tree :func:`dumps` wrote (or any ``pytree.treespec_dumps`` text), every recorded class imported again;
    a class that cannot be found is an ArtifactError naming it."""
    protocol, schema = json.loads(text)
    restored: list[tuple[Any, Any] | None] = []
    _plain_schema(schema, restored)
    plain = pytree.treespec_loads(json.dumps([protocol, schema]))
    order = iter(restored)
    return _replace(plain, lambda node: next(order))


def serialised_type_names(text: str) -> list[str]:
    """Every ``type`` a saved tree names (to import the modules that register them)."""
    return _type_names(json.loads(text))


def _marker(node: pytree.TreeSpec) -> str | None:
    """The JSON type recording ``node``'s class, for the nodes torch's pytree cannot save by itself."""
    kind = node.type
    if isinstance(kind, type) and kind.__module__ == "torch.return_types" and pytree.is_structseq_class(kind):
        return _RETURN_TYPES + kind.__name__
    if kind is pytree.namedtuple and not _saveable(node.context):
        return _NAMEDTUPLE + _qualified(node.context, ":")
    if isinstance(kind, type) and dataclasses.is_dataclass(kind) and not _saveable(kind) and _jsonable(node.context):
        return _DATACLASS + _qualified(kind, ":")
    return None


def _saveable(cls: Any) -> bool:
    node = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
    return node is not None and node.serialized_type_name != pytree.NO_SERIALIZED_TYPE_NAME_FOUND


def _unsaveable(node: pytree.TreeSpec) -> type | None:
    if node.is_leaf():
        return None
    if not _saveable(node.type):
        return node.type
    return next((t for child in _children(node) if (t := _unsaveable(child)) is not None), None)


def _write_markers(node: pytree.TreeSpec, schema: dict[str, Any]) -> None:
    if node.is_leaf():
        return
    marker = _marker(node)
    if marker is not None:
        schema["type"] = marker
        schema["context"] = json.dumps(node.context) if marker.startswith(_DATACLASS) else None
    for child, child_schema in zip(_children(node), schema["children_spec"], strict=True):
        _write_markers(child, child_schema)


def _plain_schema(schema: dict[str, Any], restored: list[tuple[Any, Any] | None]) -> None:
    """Recorded nodes become tuples in ``schema``; ``restored`` gets each non-leaf node's (type, context), or None
    to keep what torch reads, in preorder."""
    kind = schema.get("type")
    if kind is None and not schema.get("children_spec"):
        return  # a leaf
    restored.append(_restore(kind, schema.get("context")) if isinstance(kind, str) else None)
    if restored[-1] is not None:
        schema["type"], schema["context"] = "builtins.tuple", "null"
    for child in schema["children_spec"]:
        _plain_schema(child, restored)


def _restore(kind: str, context: str | None) -> tuple[Any, Any] | None:
    if kind.startswith(_RETURN_TYPES):
        cls = _import(f"torch.return_types:{kind.removeprefix(_RETURN_TYPES)}", pytree.is_structseq_class)
        return cls, None
    if kind.startswith(_NAMEDTUPLE):
        return pytree.namedtuple, _import(kind.removeprefix(_NAMEDTUPLE), lambda c: hasattr(c, "_fields"))
    if kind.startswith(_DATACLASS):
        cls = _import(kind.removeprefix(_DATACLASS), dataclasses.is_dataclass)
        if cls not in pytree.SUPPORTED_NODES:
            pytree.register_dataclass(cls)
        return cls, json.loads(context or "null")
    return None


def _import(name: str, check: Callable[[Any], bool]) -> type:
    module_name, _, qualname = name.partition(":")
    found: Any = None
    try:
        found = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        found = None
    if not (isinstance(found, type) and check(found)):
        raise ArtifactError(
            f"the saved output structure holds {module_name}.{qualname}, which cannot be imported here "
            f"(torch {torch.__version__})",
            fix="load the artifact where that class is importable (the same code and library versions that saved "
            "it), or convert the model again here",
        )
    return found


def _qualified(cls: type, sep: str = ".") -> str:
    return f"{cls.__module__}{sep}{cls.__qualname__}"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _children(node: pytree.TreeSpec) -> list[pytree.TreeSpec]:
    # torch >= 2.10 has children(); older versions only the children_specs attribute
    return list(node.children()) if hasattr(node, "children") else list(node.children_specs)


def _replace(node: pytree.TreeSpec, swap: Callable[[pytree.TreeSpec], tuple[Any, Any] | None]) -> pytree.TreeSpec:
    """A copy of the tree; ``swap(node)`` gives a new ``(type, context)`` for a node, or None to keep it. Nodes
    are visited in preorder (leaves excluded)."""
    if node.is_leaf():
        return node
    new = swap(node)
    children = [_replace(child, swap) for child in _children(node)]
    kind, context = new if new is not None else (node.type, node.context)
    return pytree.TreeSpec(kind, context, children)


def _type_names(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("type"), str):
            found.append(node["type"])
        for child in node.get("children_spec", []):
            found += _type_names(child)
    elif isinstance(node, list):
        for child in node:
            found += _type_names(child)
    return found
