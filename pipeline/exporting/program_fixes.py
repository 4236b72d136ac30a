"""Rewrites of the torch.export program before its ONNX translation, where the exporter refuses a form of an op
that an equivalent form it takes can express exactly.

- ``scaled_dot_product_attention`` on 3-d ``[batch, length, embedding]`` tensors: the exporter takes only 4-d
  ones, so each 3-d input gets a head axis of one (``unsqueeze(1)``) and the result loses it again.
- ``scaled_dot_product_attention`` whose key and value have one head for a query of several (multi-query
  attention written as a broadcast, as Falcon does): the exporter requires equal head counts unless
  ``enable_gqa``, and with one key/value head grouped-query attention is that broadcast exactly, so the node gets
  ``enable_gqa=True`` (one ONNX ``Attention`` node with ``kv_num_heads`` 1; the keys are not repeated).
- ``hstack``/``vstack``/``dstack``/``column_stack`` and ``atleast_{1,2,3}d`` of a list: the exporter translates
  them with ONNX sequence ops (``SequenceConstruct``/``SequenceMap``), which TensorRT's parser has no importer for.
  Decomposed first (PyTorch's own decompositions), they are ``unsqueeze``/``view`` and one ``cat``.
- ``as_strided_scatter`` through a 0-d view (``size=[]``, ``stride=[]``): the empty lists have no type in ONNX, so
  the node cannot be written; the same one element is the 1-d view ``size=[1]``, ``stride=[1]`` of ``src``
  reshaped to ``[1]``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from pipeline.exporting.histogram_edges import histogramdd_per_dimension

logger = logging.getLogger(__name__)

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_STRIDED_SCATTER = torch.ops.aten.as_strided_scatter.default
_A = torch.ops.aten
#: Ops the exporter writes with sequence ops; PyTorch's decompositions of them (and of what they decompose into).
_SEQUENCE_OPS = (
    _A.hstack.default, _A.vstack.default, _A.dstack.default, _A.column_stack.default,
    _A.atleast_1d.Sequence, _A.atleast_2d.Sequence, _A.atleast_3d.Sequence,
    _A.atleast_1d.default, _A.atleast_2d.default, _A.atleast_3d.default,
)  # fmt: skip


def fix_program(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with every rewrite applied (in place; returned for chaining)."""
    changed = _attention_to_4d(program.graph_module.graph)
    grouped = _broadcast_heads_as_grouped(program.graph_module.graph)
    if grouped:
        logger.debug("scaled_dot_product_attention over one key/value head made grouped at %d node(s)", grouped)
    if histogramdd_per_dimension(program.graph_module.graph):
        program.graph_module.recompile()
    if changed:
        logger.debug("3-d scaled_dot_product_attention given a head axis at %d node(s)", changed)
    scattered = _scalar_strided_scatter_as_1d(program.graph_module.graph)
    if scattered:
        logger.debug("0-d as_strided_scatter written as 1-d at %d node(s)", scattered)
    if changed or grouped or scattered:
        program.graph_module.recompile()
    return _without_sequence_ops(program)


def _without_sequence_ops(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with the stacking ops decomposed (a new program), or ``program`` itself when it has none."""
    found = {n.target for n in program.graph_module.graph.nodes if n.op == "call_function"} & set(_SEQUENCE_OPS)
    if not found:
        return program
    defaults = torch.export.default_decompositions()
    table: dict[Any, Any] = {}
    for op in _SEQUENCE_OPS:  # the export table holds the list forms; the per-tensor forms decompose themselves
        if op in defaults:
            table[op] = defaults[op]
        else:
            table[op] = op.decompose
    logger.debug("decomposed before translation (no sequence ops): %s", sorted(str(op) for op in found))
    return program.run_decompositions(table)


def _attention_to_4d(graph: torch.fx.Graph) -> int:
    """3-d attention nodes rewritten as 4-d with one head; returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _SDPA or _rank(node.args[0]) != 3:
            continue
        with graph.inserting_before(node):
            args = [_unsqueezed(graph, a) if i < 4 and _rank(a) == 3 else a for i, a in enumerate(node.args)]
            attention = graph.call_function(_SDPA, tuple(args), dict(node.kwargs))
            attention.meta = {**node.meta, "val": _SDPA(*_vals(args), **node.kwargs)}
        with graph.inserting_after(attention):
            squeezed = graph.call_function(torch.ops.aten.squeeze.dim, (attention, 1))
            squeezed.meta = {**node.meta, "val": attention.meta["val"].squeeze(1)}
        node.replace_all_uses_with(squeezed)
        graph.erase_node(node)
        count += 1
    return count


def _broadcast_heads_as_grouped(graph: torch.fx.Graph) -> int:
    """4-d attention nodes whose key and value have one head and the query several, given ``enable_gqa=True``
    (the same numbers: one head repeated is one head broadcast); returns how many."""
    count = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not _SDPA or node.kwargs.get("enable_gqa"):
            continue
        query, key, value = (_val(a) for a in node.args[:3])
        if not all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in (query, key, value)):
            continue
        heads = [v.shape[1] for v in (query, key, value)]
        if not all(isinstance(h, int) for h in heads) or not (heads[1] == heads[2] == 1 < heads[0]):
            continue
        node.kwargs = {**node.kwargs, "enable_gqa": True}
        count += 1
    return count


def _val(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else None


def _scalar_strided_scatter_as_1d(graph: torch.fx.Graph) -> int:
    """``as_strided_scatter(self, src, [], [], offset)`` nodes rewritten with ``src.view([1])``, ``[1]``, ``[1]``;
    returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _STRIDED_SCATTER or list(node.args[2]) != []:
            continue
        source = node.args[1]
        with graph.inserting_before(node):
            flat = graph.call_function(torch.ops.aten.view.default, (source, [1]))
            flat.meta = {**source.meta, "val": source.meta["val"].view([1])}
        node.args = (node.args[0], flat, [1], [1], *node.args[4:])
        count += 1
    return count


def _rank(value: Any) -> int | None:
    val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


def _unsqueezed(graph: torch.fx.Graph, value: torch.fx.Node) -> torch.fx.Node:
    node = graph.call_function(torch.ops.aten.unsqueeze.default, (value, 1))
    node.meta = {**value.meta, "val": value.meta["val"].unsqueeze(1)}
    return node


def _vals(args: list[Any]) -> list[Any]:
    return [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
