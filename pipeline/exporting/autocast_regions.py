"""Autocast regions that change nothing, inlined into the program.

A model that turns autocast off around a part of ``forward`` (``with torch.autocast("cuda", enabled=False):``, as
Z-Image's rotary embedding does to keep its complex arithmetic in float32) is traced by torch.export into a
``wrap_with_autocast`` higher-order op whose body is a sub-module. The region is a no-op when it disables autocast
(the export runs without autocast) or names a device none of the program's tensors is on (``"cuda"`` for a model
exported on the CPU): its ops compute exactly as they would outside it. Inlined, the rewrites that read the
top-level graph (:mod:`pipeline.exporting.complex_as_real`) see its ops. A region that enables autocast on a device
the tensors are on (a model on a GPU) changes dtypes and is left as traced.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch._higher_order_ops.wrap import wrap_with_autocast


def inline_inert_autocast(program: torch.export.ExportedProgram) -> int:
    """Inline every ``wrap_with_autocast`` of ``program`` that changes nothing (module doc); the number inlined."""
    module = program.graph_module
    graph = module.graph
    regions = [n for n in graph.nodes if n.op == "call_function" and n.target is wrap_with_autocast]
    if not regions:
        return 0
    values = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
    devices = {value.device.type for value in values if isinstance(value, torch.Tensor)}
    inlined = 0
    for node in regions:
        device_type, _dtype, enabled, _cache, body, *operands = node.args
        if enabled and device_type in devices:
            continue
        if not isinstance(body, torch.fx.Node) or body.op != "get_attr":
            continue
        sub = getattr(module, str(body.target), None)
        if not isinstance(sub, torch.fx.GraphModule) or not _inlinable(sub, node):
            continue
        results = _copy_body(graph, node, sub, operands)
        for user in list(node.users):
            user.replace_all_uses_with(results[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        if not body.users:
            graph.erase_node(body)
            delattr(module, str(body.target))
        inlined += 1
    if inlined:
        module.recompile()
    return inlined


def _inlinable(sub: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Only calls and placeholders in the body (no attribute of its own, no nested region), and the region's
    results read only through ``getitem``."""
    if any(n.op not in ("placeholder", "call_function", "output") for n in sub.graph.nodes):
        return False
    if any(n.target is wrap_with_autocast for n in sub.graph.nodes):
        return False
    return all(u.op == "call_function" and u.target is operator.getitem for u in node.users)


def _copy_body(graph: torch.fx.Graph, node: torch.fx.Node, sub: torch.fx.GraphModule, operands: list[Any]) -> list[Any]:
    """The body's nodes copied before ``node``, its placeholders read as ``operands``; its results."""
    env: dict[torch.fx.Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, operands, strict=True))
    results: list[Any] = []
    with graph.inserting_before(node):
        for inner in sub.graph.nodes:
            if inner.op == "placeholder":
                continue
            if inner.op == "output":
                outputs = inner.args[0]
                results = [env[o] if isinstance(o, torch.fx.Node) else o for o in outputs]
                break
            env[inner] = graph.node_copy(inner, lambda n: env[n])
    return results
