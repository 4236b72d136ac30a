"""Rewrites of the torch.export program before its ONNX translation, where the exporter refuses a form of an op
that an equivalent form it takes can express exactly.

- ``scaled_dot_product_attention`` on 3-d ``[batch, length, embedding]`` tensors: the exporter takes only 4-d
  ones, so each 3-d input gets a head axis of one (``unsqueeze(1)``) and the result loses it again.
- ``scaled_dot_product_attention`` whose key and value have one head for a query of several (multi-query
  attention written as a broadcast, as Falcon does): the exporter requires equal head counts unless
  ``enable_gqa``, and with one key/value head grouped-query attention is that broadcast exactly, so the node gets
  ``enable_gqa=True`` (one ONNX ``Attention`` node with ``kv_num_heads`` 1; the keys are not repeated).
- ``scaled_dot_product_attention`` on 5-d and higher tensors (timm's Hiera: ``[batch, heads, windows, tokens,
  dim]``): the leading axes, equal in query, key and value, are flattened into one batch axis and restored on the
  result (a mask of rank 3 or less broadcasts as before; one of the full rank is flattened too). Attention is
  independent per leading index, so this is exact.
- ``hstack``/``vstack``/``dstack``/``column_stack`` and ``atleast_{1,2,3}d`` of a list: the exporter translates
  them with ONNX sequence ops (``SequenceConstruct``/``SequenceMap``), which TensorRT's parser has no importer for.
  Decomposed first (PyTorch's own decompositions), they are ``unsqueeze``/``view`` and one ``cat``.
- ``as_strided_scatter`` through a 0-d view (``size=[]``, ``stride=[]``): the empty lists have no type in ONNX, so
  the node cannot be written; the same one element is the 1-d view ``size=[1]``, ``stride=[1]`` of ``src``
  reshaped to ``[1]``.
- ``rsub(x, s)`` with a Python number ``s`` (``1.0 - attention_mask`` in XLNet and ProphetNet): the exporter's
  decompositions write it ``aten.sub(s, x)``, a number as ``self``, which no overload of ``aten.sub`` takes, so the
  translation fails ("Cannot find a compatible OpOverload for aten.sub"). It is ``sub(scalar_tensor(s), x)`` with the
  number a 0-d tensor of the result's dtype: the same promotion (a 0-d tensor does not widen a tensor of its
  category; of a higher category it gives its own dtype, the result's) and the same subtraction.
- ``squeeze`` of an axis whose size is known and not 1 (Pixtral's ``squeeze(0)`` of its patch features when there
  are several), or sized from data and decided not 1 by the trace (the result keeps its rank): PyTorch leaves such
  an axis, ONNX ``Squeeze`` refuses it (the graph does not load, or fails at run time), and the exporter writes the
  ``Squeeze`` anyway. The axis is dropped from the node, and a node left with no axis is its input.
- ``as_strided`` of a view whose strides are not row-major (Longformer's and LED's sliding chunks): applied to the
  contiguous tensor whose memory the view reads (:mod:`pipeline.exporting.strided_views`).
- ``copy_`` of a source PyTorch broadcasts to its destination (CogVideoX writes a ``[n, d]`` table into a
  ``[1, n, d]`` slice): the exporter's translation keeps the source's shape, and the ``slice_scatter`` it writes
  then has an invalid ``Transpose``; the source is expanded to the destination's static shape first.
- autocast regions that change nothing (``torch.autocast("cuda", enabled=False)`` around Z-Image's rotary
  embedding): inlined, so the rewrites below see their ops (:mod:`pipeline.exporting.autocast_regions`).
- complex arithmetic inside the model (rotary embeddings written with ``torch.polar``/``view_as_complex``): written
  as real arithmetic on (real, imaginary) pairs (:mod:`pipeline.exporting.complex_as_real`).
- runtime assertions (``torch._check`` on data: LLaVA's image-token count, ``torch_compilable_check``): the exporter
  removes the assertion nodes but still translates the ops that only fed them, and one of those,
  ``aten._is_all_true``, has no translation. The assertions and what only they read are removed first.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from pipeline.exporting.autocast_regions import inline_inert_autocast
from pipeline.exporting.complex_as_real import complex_as_real
from pipeline.exporting.histogram_edges import histogramdd_per_dimension
from pipeline.exporting.strided_views import as_strided_on_base

logger = logging.getLogger(__name__)

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_STRIDED_SCATTER = torch.ops.aten.as_strided_scatter.default
_ASSERTIONS = (  # the exporter's own list (torch.onnx's remove_assertion_nodes)
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten._assert_async.default,
    torch.ops.aten._assert_async.msg,
    torch.ops.aten._assert_scalar.default,
)
_SUBTRACTIONS = (torch.ops.aten.rsub.Scalar, torch.ops.aten.rsub.Tensor, torch.ops.aten.sub.Tensor)
_A = torch.ops.aten
#: Ops the exporter writes with sequence ops; PyTorch's decompositions of them (and of what they decompose into).
_SEQUENCE_OPS = (
    _A.hstack.default, _A.vstack.default, _A.dstack.default, _A.column_stack.default,
    _A.atleast_1d.Sequence, _A.atleast_2d.Sequence, _A.atleast_3d.Sequence,
    _A.atleast_1d.default, _A.atleast_2d.default, _A.atleast_3d.default,
)  # fmt: skip


def fix_program(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with every rewrite applied (in place; returned for chaining)."""
    if inline_inert_autocast(program):
        logger.debug("autocast regions that change nothing inlined")
    complex_as_real(program)
    rebased = as_strided_on_base(program.graph_module.graph)
    if rebased:
        logger.debug("as_strided of a strided view applied to its contiguous base at %d node(s)", rebased)
    changed = _attention_to_4d(program.graph_module.graph)
    grouped = _broadcast_heads_as_grouped(program.graph_module.graph)
    if grouped:
        logger.debug("scaled_dot_product_attention over one key/value head made grouped at %d node(s)", grouped)
    if histogramdd_per_dimension(program.graph_module.graph):
        program.graph_module.recompile()
    if changed:
        logger.debug("3-d or 5-d+ scaled_dot_product_attention written as 4-d at %d node(s)", changed)
    scattered = _scalar_strided_scatter_as_1d(program.graph_module.graph)
    if scattered:
        logger.debug("0-d as_strided_scatter written as 1-d at %d node(s)", scattered)
    subtracted = _number_minus_tensor_as_sub(program.graph_module.graph)
    if subtracted:
        logger.debug("number - tensor written as sub(scalar_tensor, tensor) at %d node(s)", subtracted)
    expanded = _copy_sources_expanded(program.graph_module.graph)
    if expanded:
        logger.debug("the source of a broadcasting copy_ expanded to its destination's shape at %d node(s)", expanded)
    unchecked = _without_data_assertions(program.graph_module.graph)
    if unchecked:
        logger.debug("%d runtime assertion(s) on data removed with what only they read", unchecked)
    kept = _squeeze_only_ones(program.graph_module.graph)
    if kept:
        logger.debug("squeeze of an axis not of size 1 left out at %d node(s)", kept)
    hinted = _repeat_interleave_without_size_hint(program.graph_module.graph)
    if hinted:
        logger.debug("repeat_interleave's output_size hint left out at %d node(s)", hinted)
    if changed or grouped or scattered or subtracted or expanded or unchecked or kept or rebased or hinted:
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
    """3-d attention nodes rewritten as 4-d with one head, 5-d and higher ones with their leading axes flattened;
    returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        rank = _rank(node.args[0])
        if rank is not None and rank > 4:
            count += _flatten_leading_axes(graph, node, rank)
        if rank != 3:
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


def _flatten_leading_axes(graph: torch.fx.Graph, node: torch.fx.Node, rank: int) -> int:
    """One ``rank``-d attention node as 4-d over its flattened leading axes (module doc); 0 when the inputs do not
    share their leading axes (broadcasting between them is left to the exporter, which refuses it)."""
    args: list[Any] = list(node.args) + [None] * (4 - len(node.args))
    kwargs = dict(node.kwargs)
    mask_in_kwargs = args[3] is None and "attn_mask" in kwargs
    mask: Any = kwargs.get("attn_mask") if mask_in_kwargs else args[3]
    leading = _shape(args[0])[: rank - 3]
    if any(_rank(a) != rank or _same_axes(a, rank) != _same_axes(args[0], rank) for a in args[:3]):
        return 0
    mask_rank = _rank(mask) if isinstance(mask, torch.fx.Node) else None
    flatten_mask = mask_rank == rank and _same_axes(mask, rank) == _same_axes(args[0], rank)
    if isinstance(mask, torch.fx.Node) and not flatten_mask and (mask_rank is None or mask_rank > 3):
        return 0
    with graph.inserting_before(node):
        flat = [_flattened(graph, a, rank) for a in args[:3]]
        flat_mask = _flattened(graph, mask, rank) if flatten_mask else mask
        new_args: list[Any] = [*flat, *node.args[3:]]
        if mask_in_kwargs:
            kwargs["attn_mask"] = flat_mask
        elif len(new_args) > 3:
            new_args[3] = flat_mask
        attention = graph.call_function(_SDPA, tuple(new_args), kwargs)
        attention.meta = {**node.meta, "val": _SDPA(*_vals(new_args), **_meta_kwargs(kwargs))}
        sizes = [d if isinstance(d, int) else _size_of(graph, args[0], i) for i, d in enumerate(leading)]
        restored = graph.call_function(torch.ops.aten.unflatten.int, (attention, 0, sizes))
        restored.meta = {**node.meta, "val": attention.meta["val"].unflatten(0, tuple(leading))}
    node.replace_all_uses_with(restored)
    graph.erase_node(node)
    return 1


def _shape(value: Any) -> tuple[Any, ...]:
    return tuple(value.meta["val"].shape) if isinstance(value, torch.fx.Node) else ()


def _same_axes(value: Any, rank: int) -> tuple[str, ...]:
    """The leading axes' sizes as text: equal symbols compare equal without a guard on the shape environment."""
    return tuple(str(d) for d in _shape(value)[: rank - 3])


def _flattened(graph: torch.fx.Graph, value: torch.fx.Node, rank: int) -> torch.fx.Node:
    node = graph.call_function(torch.ops.aten.flatten.using_ints, (value, 0, rank - 4))
    node.meta = {**value.meta, "val": value.meta["val"].flatten(0, rank - 4)}
    return node


def _size_of(graph: torch.fx.Graph, value: torch.fx.Node, axis: int) -> torch.fx.Node:
    node = graph.call_function(torch.ops.aten.sym_size.int, (value, axis))
    node.meta = {"val": value.meta["val"].shape[axis]}
    return node


def _meta_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.meta["val"] if isinstance(v, torch.fx.Node) else v for k, v in kwargs.items()}


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


def _squeeze_only_ones(graph: torch.fx.Graph) -> int:
    """``squeeze.dim``/``squeeze.dims`` nodes without the axes whose size is known and not 1 (PyTorch keeps those);
    a node left with no axis replaced by its input, as is one whose result keeps its input's rank (an axis sized
    from data that the trace decided is not 1: Mistral 3's patch features). Returns how many nodes changed."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (_A.squeeze.dim, _A.squeeze.dims):
            continue
        shape = _shape(node.args[0])
        given = node.args[1] if node.target is _A.squeeze.dims else [node.args[1]]
        rank = len(shape)
        if not rank or not all(isinstance(axis, int) for axis in given):
            continue
        kept = [axis for axis in given if not (isinstance(shape[axis % rank], int) and shape[axis % rank] != 1)]
        if len(_shape(node)) == rank:  # PyTorch squeezed nothing: a size from data, not 1 for the sample
            kept = []
        if len(kept) == len(given):
            continue
        count += 1
        if kept:  # squeeze.dims: one of one axis (squeeze.dim) is kept or dropped whole
            node.args = (node.args[0], kept)
        else:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    return count


def _repeat_interleave_without_size_hint(graph: torch.fx.Graph) -> int:
    """``repeat_interleave`` without its ``output_size`` keyword (a hint of the result's length, which the traced
    shape already holds): the exporter's translation takes no such argument and failed on it (Kimi K2.5's tower).
    Returns how many nodes changed."""
    count = 0
    for node in graph.nodes:
        if node.op == "call_function" and node.target in _REPEAT_INTERLEAVE and "output_size" in node.kwargs:
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "output_size"}
            count += 1
    return count


_REPEAT_INTERLEAVE = (_A.repeat_interleave.Tensor, _A.repeat_interleave.self_Tensor, _A.repeat_interleave.self_int)


def _copy_sources_expanded(graph: torch.fx.Graph) -> int:
    """``copy_``/``copy`` of a source of another shape (PyTorch broadcasts it to the destination's) with the source
    expanded to the destination's static shape first; returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (_A.copy_.default, _A.copy.default) or len(node.args) < 2:
            continue
        destination, source = node.args[0], node.args[1]
        if not isinstance(source, torch.fx.Node):
            continue
        shape, given = _shape(destination), _shape(source)
        if given == shape or not shape or not all(isinstance(d, int) for d in shape):
            continue
        with graph.inserting_before(node):
            expanded = graph.call_function(_A.expand.default, (source, list(shape)))
        expanded.meta = {k: v for k, v in node.meta.items() if k != "val"}
        expanded.meta["val"] = _val(source).expand(shape)
        node.args = (destination, expanded, *node.args[2:])
        count += 1
    return count


def _without_data_assertions(graph: torch.fx.Graph) -> int:
    """Remove the assertion nodes that read data-dependent values (an ``aten._is_all_true`` among what they read),
    then every node only they read; returns how many assertions."""
    assertions = [n for n in graph.nodes if n.op == "call_function" and n.target in _ASSERTIONS]
    if not any(_reads_all_true(n) for n in assertions):
        return 0
    for node in assertions:
        graph.erase_node(node)
    graph.eliminate_dead_code()
    return len(assertions)


def _reads_all_true(node: torch.fx.Node) -> bool:
    """Whether ``node`` reads, directly or through other nodes, an ``aten._is_all_true``."""
    seen: set[torch.fx.Node] = set()
    pending = list(node.all_input_nodes)
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.target is torch.ops.aten._is_all_true.default:
            return True
        pending.extend(current.all_input_nodes)
    return False


def _number_minus_tensor_as_sub(graph: torch.fx.Graph) -> int:
    """``rsub(x, s, alpha)`` (``s - alpha * x``) with a number ``s``, and ``sub(s, x, alpha)`` with a number as
    ``self``, rewritten as ``sub(scalar_tensor(s, dtype=the result's), x, alpha)``; returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _SUBTRACTIONS or len(node.args) < 2:
            continue
        value = node.meta.get("val")
        reverse = node.target is not torch.ops.aten.sub.Tensor
        number, tensor = (node.args[1], node.args[0]) if reverse else node.args[:2]
        if not isinstance(value, torch.Tensor) or not isinstance(number, int | float) or isinstance(number, bool):
            continue
        if not isinstance(tensor, torch.fx.Node):
            continue
        with graph.inserting_before(node):
            scalar = graph.call_function(
                torch.ops.aten.scalar_tensor.default, (number,), {"dtype": value.dtype, "device": value.device}
            )
            scalar.meta = {**node.meta, "val": value.new_empty((), dtype=value.dtype)}
            alpha = node.args[2] if len(node.args) > 2 else node.kwargs.get("alpha", 1)
            kwargs = {} if alpha == 1 else {"alpha": alpha}
            sub = graph.call_function(torch.ops.aten.sub.Tensor, (scalar, tensor), kwargs)
            sub.meta = dict(node.meta)
        node.replace_all_uses_with(sub)
        graph.erase_node(node)
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
