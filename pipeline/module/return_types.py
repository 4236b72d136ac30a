"""``torch.return_types`` namedtuples (``torch.max(x, dim)``, ``topk``, ``sort``, ...) in saved pytree specs.

torch's pytree flattens these structseq types but has no serialisation name for them, so
``pytree.treespec_dumps`` refuses any result that holds one. Here they are written as tuples whose JSON ``type``
is ``torch.return_types.<name>``, and read back as the same class: a converted module returns
``torch.return_types.max(values=..., indices=...)`` exactly as the model did.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.utils._pytree as pytree

from converters.errors import ArtifactError

_PREFIX = "torch.return_types."


def dumps(tree: pytree.TreeSpec) -> str:
    """``pytree.treespec_dumps(tree)``, with every ``torch.return_types`` node recorded by its class name.

    >>> _, tree = pytree.tree_flatten(torch.max(torch.ones(2, 3), 1))
    >>> loads(dumps(tree)) == tree
    True
    """
    plain = _replace(tree, lambda node: (tuple, None) if _is_return_type(node.type) else None)
    protocol, schema = json.loads(pytree.treespec_dumps(plain))
    _name_return_types(tree, schema)
    return json.dumps([protocol, schema])


def loads(text: str) -> pytree.TreeSpec:
    """The tree :func:`dumps` wrote (or any ``pytree.treespec_dumps`` text), return types restored."""
    protocol, schema = json.loads(text)
    classes: list[type | None] = []
    _plain_schema(schema, classes)
    plain = pytree.treespec_loads(json.dumps([protocol, schema]))
    order = iter(classes)

    def restore(node: pytree.TreeSpec) -> tuple[Any, Any] | None:
        cls = next(order)
        return None if cls is None else (cls, None)

    return _replace(plain, restore)


def _is_return_type(cls: Any) -> bool:
    return isinstance(cls, type) and cls.__module__ == "torch.return_types" and pytree.is_structseq_class(cls)


def _return_type(name: str) -> type:
    cls = getattr(torch.return_types, name, None)
    if not _is_return_type(cls):
        raise ArtifactError(
            f"the saved output structure holds torch.return_types.{name}, which this torch ({torch.__version__}) "
            "does not have",
            fix="load the artifact with the torch version that saved it, or convert the model again here",
        )
    assert isinstance(cls, type)
    return cls


def _children(node: pytree.TreeSpec) -> list[pytree.TreeSpec]:
    # torch >= 2.10 has children(); older versions only the children_specs attribute
    return list(node.children()) if hasattr(node, "children") else list(node.children_specs)


def _replace(node: pytree.TreeSpec, swap: Any) -> pytree.TreeSpec:
    """A copy of the tree; ``swap(node)`` gives a new ``(type, context)`` for a node, or None to keep it. Nodes
    are visited in preorder (leaves excluded)."""
    if node.is_leaf():
        return node
    new = swap(node)
    children = [_replace(child, swap) for child in _children(node)]
    kind, context = new if new is not None else (node.type, node.context)
    return pytree.TreeSpec(kind, context, children)


def _name_return_types(node: pytree.TreeSpec, schema: dict[str, Any]) -> None:
    if node.is_leaf():
        return
    if _is_return_type(node.type):
        schema["type"] = _PREFIX + node.type.__name__
    for child, child_schema in zip(_children(node), schema["children_spec"], strict=True):
        _name_return_types(child, child_schema)


def _plain_schema(schema: dict[str, Any], classes: list[type | None]) -> None:
    """Return-type nodes become tuples in ``schema``; ``classes`` gets each non-leaf node's class (or None) in
    preorder."""
    kind = schema.get("type")
    if kind is None and not schema.get("children_spec"):
        return  # a leaf
    if isinstance(kind, str) and kind.startswith(_PREFIX):
        classes.append(_return_type(kind.removeprefix(_PREFIX)))
        schema["type"] = "builtins.tuple"
    else:
        classes.append(None)
    for child in schema["children_spec"]:
        _plain_schema(child, classes)
