"""A cached decoder step's attention layers as :mod:`pipeline.runtime.ort.grouped_attention` finds them in the step
graph: each layer's ``TensorScatter(key) + TensorScatter(value) + Attention`` triple (:func:`triples`), what surrounds
it (:class:`Around`), and the [batch, steps, heads * dim] tensors the model split into heads (:func:`merged_heads`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import TensorProto, helper

from pipeline.runtime.ort.graph_index import GraphIndex, graph_index, perm
from pipeline.runtime.ort.recorded_types import Dim, dim_size, same_dim, shapes_of

#: The attribute names of ONNX ``Attention`` the rewrite carries over (any other one keeps the node as it is).
_CARRIED = frozenset({"scale", "softcap"})
#: The prefix of every name the rewrite adds to the graph.
PREFIX = "ort_gqa"


@dataclass(frozen=True)
class Triple:
    """One layer's cache writes of its new keys and values (``TensorScatter``) and the ``Attention`` reading them."""

    attention: onnx.NodeProto
    key_write: onnx.NodeProto
    value_write: onnx.NodeProto


@dataclass(frozen=True)
class Around(GraphIndex):
    """The original graph around its attention nodes: the index, the recorded shapes, and the nodes a rewritten layer
    takes over (:attr:`skipped`: not copied into the new graph)."""

    shapes: dict[str, list[Dim]] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)


def around_of(model: onnx.ModelProto) -> Around:
    """The index and recorded shapes of ``model``'s graph, nothing skipped yet."""
    index = graph_index(model.graph)
    return Around(**{f: getattr(index, f) for f in GraphIndex.__dataclass_fields__}, shapes=shapes_of(model))


def has_cached_attention(model: onnx.ModelProto) -> bool:
    """Does ``model`` hold a cached step's ``TensorScatter`` + ``Attention`` that
    :func:`~pipeline.runtime.ort.grouped_attention.grouped_attention_graph` can rewrite?"""
    return bool(triples(model))


def triples(model: onnx.ModelProto) -> list[Triple]:
    """Each layer's cache writes and attention, where the kernel can take them over: a float32 rank-4 cache written at
    ``past_length`` along its sequence axis and read by the attention alone, and the attention's attributes ones the
    kernel has."""
    index = graph_index(model.graph)
    inputs = index.inputs
    if "past_length" not in inputs or "input_ids" not in inputs:
        return []
    found = []
    for node in model.graph.node:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx") or len(node.input) != 4:
            continue
        if any(a.name not in _CARRIED for a in node.attribute):
            continue
        writes = [index.producers.get(name) for name in node.input[1:3]]
        if not all(w is not None and w.op_type == "TensorScatter" for w in writes):
            continue
        key_write, value_write = writes
        assert key_write is not None and value_write is not None
        if not all(_is_cache_write(w, index) for w in (key_write, value_write)):
            continue
        if key_write.input[2] != value_write.input[2] and not _same_position(key_write, value_write, index):
            continue
        found.append(Triple(node, key_write, value_write))
    if found and not all(_rank4(inputs[t.key_write.input[0]]) for t in found):
        return []
    # the kernel's head size must be a multiple of 8 (ONNX Runtime refuses the node when run otherwise: a small
    # Moonshine's 4); such layers keep the standard TensorScatter + Attention
    return [t for t in found if _head_size(inputs[t.key_write.input[0]]) % 8 == 0]


def _head_size(cache: onnx.ValueInfoProto) -> int:
    """The last dimension of a rank-4 cache input [batch, heads, capacity, head size]."""
    return int(cache.type.tensor_type.shape.dim[3].dim_value)


def _is_cache_write(node: onnx.NodeProto, index: GraphIndex) -> bool:
    cache = index.inputs.get(node.input[0])
    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), -2)
    return (
        cache is not None
        and cache.type.tensor_type.elem_type == TensorProto.FLOAT
        and axis in (-2, 2)
        and index.reader_count(node.output[0]) == 1  # the attention only (and the graph output)
    )


def _same_position(a: onnx.NodeProto, b: onnx.NodeProto, index: GraphIndex) -> bool:
    """Both writes index by ``past_length`` (the step's converter expands it per row for each write)."""
    return _reads_past_length(a.input[2], index) and _reads_past_length(b.input[2], index)


def _reads_past_length(name: str, index: GraphIndex, depth: int = 4) -> bool:
    if name == "past_length":
        return True
    node = index.producers.get(name)
    if node is None or depth == 0:
        return False
    return any(_reads_past_length(i, index, depth - 1) for i in node.input[:1])


def _rank4(value: onnx.ValueInfoProto) -> bool:
    dims = value.type.tensor_type.shape.dim
    return len(dims) == 4 and all(d.HasField("dim_value") for d in dims[1:])


def merged_heads(name: str, heads: int, around: Around) -> tuple[str, onnx.NodeProto | None] | None:
    """The [batch, steps, heads * dim] tensor the model split into ``name`` [batch, heads, steps, dim] (``Reshape`` to
    [batch, steps, heads, dim], ``Transpose``), and the ``RotaryEmbedding`` it then applied (None: none)."""
    rotary = around.producer(name, "RotaryEmbedding")
    transpose = around.producer(rotary.input[0] if rotary is not None else name, "Transpose")
    if transpose is None or perm(transpose) != [0, 2, 1, 3]:
        return None
    reshape = around.producer(transpose.input[0], "Reshape")
    if reshape is None:
        return None
    source = reshape.input[0]
    merged, split = around.shapes.get(source) or [], around.shapes.get(reshape.output[0]) or []
    dim = dim_size(split[3]) if len(split) == 4 else None
    if (
        len(merged) != 3
        or dim is None
        or not (same_dim(merged[0], split[0]) and same_dim(merged[1], split[1]))
        or dim_size(split[2]) != heads
        or dim_size(merged[2]) != heads * dim
    ):
        return None
    return source, rotary
