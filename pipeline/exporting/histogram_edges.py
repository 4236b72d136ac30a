"""A rewrite of the torch.export program before its ONNX translation: ``torch.histogramdd`` with bin counts.

``aten::histogramdd`` returns its bin edges as a list of tensors (one per dimension), and the exporter decomposes it
into ``_histogramdd_bin_edges``, whose output is that list: no ONNX node, opaque or not, has a list output. Each
edge tensor is exactly the edges of a one-dimensional ``histogram.bin_ct`` of that dimension's column (the same
outer edges from the column's min and max or the given range, the same ``linspace``), so the node becomes
``_histogramdd_from_bin_cts`` for the counts (it has a converter) and, for each ``edges[d]`` used,
``histogram.bin_ct(self.select(-1, d), bins[d], range=range[2d:2d+2])[1]``.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch

logger = logging.getLogger(__name__)

_A = torch.ops.aten
_HISTOGRAMDD = (_A.histogramdd.default, _A.histogramdd.int_bins)


def histogramdd_per_dimension(graph: torch.fx.Graph) -> int:
    """Every ``histogramdd`` node with bin counts rewritten as in the module doc; returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _HISTOGRAMDD or not _only_items(node):
            continue
        call = _arguments(node)
        points, bins = call["self"], call["bins"]
        if isinstance(bins, int):
            bins = [bins] * int(points.meta["val"].shape[-1])
        for user in list(node.users):
            if user.args[1] == 0:
                _replace_counts(graph, user, points, [int(b) for b in bins], call)
            else:
                for item in list(user.users):
                    dim = int(item.args[1])
                    with graph.inserting_before(item):
                        edges = _dimension_edges(graph, points, dim, int(bins[dim]), call["range"])
                    item.replace_all_uses_with(edges)
                    graph.erase_node(item)
            graph.erase_node(user)
        graph.erase_node(node)
        count += 1
    if count:
        logger.debug("histogramdd rewritten per dimension at %d node(s)", count)
    return count


def _replace_counts(
    graph: torch.fx.Graph, item: torch.fx.Node, points: Any, bins: list[int], call: dict[str, Any]
) -> None:
    """``histogramdd(...)[0]`` replaced by ``_histogramdd_from_bin_cts`` of the same arguments."""
    options = {"range": call["range"], "weight": call["weight"], "density": call["density"]}
    with graph.inserting_before(item):
        hist = graph.call_function(_A._histogramdd_from_bin_cts.default, (points, bins), options)
    hist.meta = {**item.meta}
    item.replace_all_uses_with(hist)


def _only_items(node: torch.fx.Node) -> bool:
    """Is every use of ``node`` an item (``[0]``, ``[1]``), and every use of ``[1]`` (the edges) an item too?"""
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            return False
        if user.args[1] == 1 and not all(u.op == "call_function" and u.target is operator.getitem for u in user.users):
            return False
    return True


def _arguments(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by name, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    call: dict[str, Any] = {}
    for index, argument in enumerate(schema.arguments):
        if index < len(node.args):
            call[argument.name] = node.args[index]
        elif argument.name in node.kwargs:
            call[argument.name] = node.kwargs[argument.name]
        else:
            call[argument.name] = argument.default_value if argument.has_default_value() else None
    return call


def _dimension_edges(graph: torch.fx.Graph, points: Any, dim: int, bins: int, given: Any) -> torch.fx.Node:
    """``histogram.bin_ct(points.select(-1, dim), bins, range=...)[1]`` with each new node's fake value."""
    column = graph.call_function(_A.select.int, (points, -1, dim))
    column.meta = {**points.meta, "val": points.meta["val"].select(-1, dim)}
    limits = None if given is None else [float(given[2 * dim]), float(given[2 * dim + 1])]
    histogram = graph.call_function(_A.histogram.bin_ct, (column, bins), {"range": limits})
    fake = column.meta["val"]
    values = (fake.new_empty((bins,)), fake.new_empty((bins + 1,)))
    histogram.meta = {**column.meta, "val": values}
    edges = graph.call_function(operator.getitem, (histogram, 1))
    edges.meta = {**column.meta, "val": values[1]}
    return edges
