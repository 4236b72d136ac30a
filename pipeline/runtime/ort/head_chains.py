"""Chains of ``Reshape`` and ``Transpose`` nodes (and scalar ``Mul`` nodes, which move nothing) between a tensor and
its split into attention heads, checked by running them on the positions of the tensor's elements.

A chain's reshapes read constant shapes, or shapes the graph computes at run time from the shapes of the chain's own
tensors (``Shape``, ``Slice``, ``Gather``, ``Concat``, ``Unsqueeze``, ``Squeeze``, ``Cast``: the exporter's form for
a dynamic batch). :func:`chain_moves` turns a chain into data (:data:`Moves`), with the shape nodes it takes over;
:func:`splits_as` and :func:`merges_as` run the moves on ``arange`` positions at concrete sizes and compare them with
the split (or merge) of heads, element for element. Used by :mod:`pipeline.runtime.ort.multi_head_attention`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pipeline.runtime.ort.graph_index import GraphIndex, perm
from pipeline.runtime.ort.recorded_types import Dim

#: One dimension of a reshape's target: a number, or (position in the chain, axis) of a tensor's shape.
Item = int | tuple[int, int]
#: A chain as data: ("Reshape", target items, allowzero), ("Transpose", permutation, False) or ("Keep", (), False).
Moves = tuple[tuple[str, tuple[Any, ...], bool], ...]
#: The nodes a run-time shape may be computed with.
_SHAPE_OPS = frozenset({"Shape", "Slice", "Gather", "Concat", "Unsqueeze", "Squeeze", "Cast"})
#: The most elements a chain is run on (a [batch, steps, width] tensor of fixed sizes past it keeps its attention).
_MOST_POSITIONS = 1 << 24
#: Two sizes tried for each symbolic dimension when a chain is checked (a chain right for both is taken as general).
_TRIED_SIZES = ((2, 3, 5, 7, 11, 13), (3, 5, 7, 11, 13, 17))


def chain_moves(
    source: str, chain: list[onnx.NodeProto], index: GraphIndex, ranks: dict[str, int]
) -> tuple[Moves, tuple[onnx.NodeProto, ...]] | None:
    """The moves of ``chain`` (in order from ``source``) and the nodes computing its run-time shapes, which go with
    it; None when a shape is computed otherwise, or when a tensor of the chain (or of its shape computation) is read
    by anything else. ``ranks``: the recorded rank of each tensor."""
    positions = {source: 0, **{node.output[0]: i + 1 for i, node in enumerate(chain)}}
    shape_nodes: dict[int, onnx.NodeProto] = {}
    moves: list[tuple[str, tuple[Any, ...], bool]] = []
    for node in chain:
        if node.op_type == "Transpose":
            moves.append(("Transpose", tuple(perm(node)), False))
        elif node.op_type == "Reshape":
            target = _items(node.input[1], positions, index, ranks, shape_nodes) if len(node.input) > 1 else None
            if target is None:
                return None
            allow_zero = any(a.name == "allowzero" and helper.get_attribute_value(a) for a in node.attribute)
            moves.append(("Reshape", tuple(target), bool(allow_zero)))
        else:
            moves.append(("Keep", (), False))
    if not _read_by_chain_only(chain, list(shape_nodes.values()), index):
        return None
    return tuple(moves), tuple(shape_nodes.values())


def _read_by_chain_only(chain: list[onnx.NodeProto], shape_nodes: list[onnx.NodeProto], index: GraphIndex) -> bool:
    """Every tensor the chain and its shape nodes make (but the chain's last) is read by them alone."""
    taken = {id(n) for n in (*chain, *shape_nodes)}
    made = [node.output[0] for node in chain[:-1]] + [o for node in shape_nodes for o in node.output]
    return all(
        name not in index.outputs and all(id(reader) in taken for reader in index.readers.get(name, ()))
        for name in made
    )


def inline_constant(index: GraphIndex, name: str) -> onnx.TensorProto | None:
    """The constant ``name`` when its value is in the graph; None for a tensor that varies or whose value is in a file
    (a loaded artifact's weights: not read to prove a rewrite)."""
    constant = index.constants.get(name)
    if constant is None or constant.data_location == onnx.TensorProto.EXTERNAL:
        return None
    return constant


def _items(
    name: str,
    positions: dict[str, int],
    index: GraphIndex,
    ranks: dict[str, int],
    visited: dict[int, onnx.NodeProto],
) -> list[Item] | None:
    """The shape tensor ``name`` as items: constants, and the dimensions of the chain's tensors it reads."""
    constant = inline_constant(index, name)
    if constant is not None:
        return [int(v) for v in numpy_helper.to_array(constant).reshape(-1)]
    node = index.producers.get(name)
    if node is None or node.op_type not in _SHAPE_OPS or node.domain not in ("", "ai.onnx"):
        return None
    visited[id(node)] = node
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Shape":
        position, rank = positions.get(node.input[0]), ranks.get(node.input[0])
        if position is None or rank is None:
            return None
        start, end = attributes.get("start", 0), attributes.get("end", rank)
        dims: list[Item] = [(position, axis) for axis in range(rank)]
        return dims[start:end]
    parts = [_items(i, positions, index, ranks, visited) if i else None for i in node.input]
    if parts[0] is None:
        return None
    if node.op_type == "Concat":
        if attributes.get("axis") not in (0, -1) or any(p is None for p in parts):
            return None
        return [item for part in parts if part is not None for item in part]
    if node.op_type in ("Unsqueeze", "Squeeze", "Cast"):
        return parts[0] if node.op_type != "Cast" or attributes.get("to") == onnx.TensorProto.INT64 else None
    if node.op_type == "Gather":
        indices = inline_constant(index, node.input[1])
        if indices is None or attributes.get("axis", 0) != 0:
            return None
        return [parts[0][int(i)] for i in numpy_helper.to_array(indices).reshape(-1)]
    bounds = [inline_constant(index, i) for i in node.input[1:]]  # Slice: starts, ends, axes, steps
    if any(b is None for b in bounds):
        return None
    values = [int(numpy_helper.to_array(b).reshape(-1)[0]) for b in bounds if b is not None]
    if len(values) >= 3 and values[2] not in (0, -1):
        return None
    step = values[3] if len(values) == 4 else 1
    return parts[0][values[0] : values[1] : step]


@functools.lru_cache(maxsize=64)  # every layer of a model has the same chains
def splits_as(shape: tuple[int, ...], moves: Moves, heads: int, layout: tuple[int, ...]) -> bool:
    """Do ``moves`` take a [batch, steps, heads * dim] tensor of ``shape`` to its heads in ``layout`` (the transposition
    of [batch, steps, heads, dim]; rank 4, or rank 3 with batch and heads as one axis), element for element?"""
    if math.prod(shape) > _MOST_POSITIONS:
        return False
    positions = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
    split = positions.reshape(shape[0], shape[1], heads, shape[2] // heads).transpose(layout)
    moved = run(positions, moves)
    if moved is None or moved.shape not in (split.shape, (split.shape[0] * heads, *split.shape[2:])):
        return False
    return bool(np.array_equal(moved.reshape(-1), split.reshape(-1)))


@functools.lru_cache(maxsize=64)
def merges_as(shape: tuple[int, ...], moves: Moves, heads: int, rank: int) -> bool:
    """Do ``moves`` take heads [batch, heads, steps, dim] (``rank`` 3: batch and heads as one axis) to their
    [batch, steps, heads * dim] of ``shape``, element for element?"""
    batch, steps, width = shape
    if math.prod(shape) > _MOST_POSITIONS:
        return False
    heads_first = np.arange(math.prod(shape), dtype=np.int32).reshape(batch, heads, steps, width // heads)
    start = heads_first if rank == 4 else heads_first.reshape(batch * heads, steps, width // heads)
    moved = run(start, moves)
    merged = heads_first.transpose(0, 2, 1, 3).reshape(shape)
    return moved is not None and moved.shape == merged.shape and bool(np.array_equal(moved, merged))


def run(array: np.ndarray, moves: Moves) -> np.ndarray | None:
    """``array`` through ``moves``; None when a shape does not fit."""
    shapes = [array.shape]
    for op, values, allow_zero in moves:
        if op == "Transpose":
            order = list(values) or list(reversed(range(array.ndim)))
            if sorted(order) != list(range(array.ndim)):
                return None
            array = array.transpose(order)
        elif op == "Reshape":
            target = [shapes[v[0]][v[1]] if isinstance(v, tuple) else v for v in values]
            if not allow_zero:
                target = [array.shape[i] if d == 0 and i < array.ndim else d for i, d in enumerate(target)]
            try:
                array = array.reshape(target)
            except (ValueError, IndexError):
                return None
        shapes.append(array.shape)
    return array


def tried_sizes(dims: list[Dim]) -> tuple[tuple[int, ...], ...]:
    """The sizes a chain is run at: one run when every dimension is known, else one per :data:`_TRIED_SIZES`."""
    return _TRIED_SIZES if any(not isinstance(d, int) for d in dims) else _TRIED_SIZES[:1]


def concrete(dims: list[Dim], sizes: tuple[int, ...]) -> tuple[int, ...]:
    """``dims`` with each symbolic or unknown dimension given one of ``sizes`` (one per distinct name)."""
    named: dict[Dim, int] = {}
    out = []
    for dim in dims:
        if isinstance(dim, int):
            out.append(dim)
            continue
        key: Dim = dim if dim is not None else f"unknown{len(named)}"
        out.append(named.setdefault(key, sizes[len(named) % len(sizes)]))
    return tuple(out)
