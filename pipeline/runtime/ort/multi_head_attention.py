"""Plain attention (``MatMul``, ``Softmax``, ``MatMul`` over heads split from [batch, steps, heads * dim]) as ONNX
Runtime's CPU kernel ``com.microsoft::MultiHeadAttention``.

An encoder exported below opset 23 computes each attention layer as the exporter decomposes
``scaled_dot_product_attention``: the queries, keys and values reshaped and transposed into heads, the scores of every
query against every key written out ([batch, heads, steps, keys]: 8 x 1500 x 1500 floats, 72 MB, per layer of a
Whisper encoder), the softmax over them in place, their product with the values, and the heads transposed back.
ONNX Runtime's ``MultiHeadAttention`` takes the [batch, steps, heads * dim] tensors as they are and, on the CPU,
computes the softmax block by block (flash attention) without writing the scores out: measured on one thread, a
Whisper-base encoder layer's attention (1500 positions, 8 heads of 64) 0.80-0.82x the time of the decomposed nodes,
0.73-0.92x at 64 to 512 positions, and the whole Whisper-base encoder 0.90-0.93x (``benchmarks/bench_seq2seq.py``).

:func:`multi_head_attention_graph` replaces each such attention with one node where that is exactly the same
computation: the ``Softmax`` over the last axis of a float32 ``MatMul`` of queries and transposed keys, read by the
``MatMul`` with the values alone and with no mask or bias added; each of the three operands a chain of ``Reshape``
(constant shapes), ``Transpose`` and scalar ``Mul`` nodes from a [batch, steps, heads * dim] tensor, and the output
such a chain back to one. Every chain is checked by running its reshapes and transposes on the positions of its
source (at two sizes of each symbolic dimension): its result must be the kernel's split into heads, element for
element (:mod:`pipeline.runtime.ort.head_chains`; a reshape's shape may be computed at run time from the chain's own
tensors, as for a dynamic batch). The scalar factors of the query and key chains become the kernel's ``scale``.
Anything else (a mask, a bias, a shape computed from other tensors) stays as it is. The session's graph only
(:func:`pipeline.runtime.ort.session_graph.runnable_model`): ``module.onnx`` stays standard ONNX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.runtime.ort.graph_index import GraphIndex, graph_index
from pipeline.runtime.ort.head_chains import (
    chain_moves,
    concrete,
    inline_constant,
    merges_as,
    splits_as,
    tried_sizes,
)
from pipeline.runtime.ort.recorded_types import Dim, recorded_types

_PREFIX = "ort_mha"
#: Longest chain of reshapes, transposes and scalar products followed from a MatMul operand to its source.
_CHAIN = 8


@dataclass(frozen=True)
class _Operand:
    """A [batch, steps, heads * dim] tensor, the nodes that split it into the MatMul's operand, and their scalar."""

    source: str
    nodes: tuple[onnx.NodeProto, ...]
    factor: float


@dataclass(frozen=True)
class _Attention:
    """One plain attention: its scores, softmax and product, its three operands, its output chain and heads."""

    scores: onnx.NodeProto
    softmax: onnx.NodeProto
    product: onnx.NodeProto
    query: _Operand
    key: _Operand
    value: _Operand
    output: str  # the [batch, steps, heads * dim] tensor the output chain ends in
    output_nodes: tuple[onnx.NodeProto, ...]
    heads: int

    def nodes(self) -> list[onnx.NodeProto]:
        """Every node the kernel takes over."""
        chains = (*self.query.nodes, *self.key.nodes, *self.value.nodes, *self.output_nodes)
        return [self.scores, self.softmax, self.product, *chains]


def has_plain_attention(model: onnx.ModelProto) -> bool:
    """Does ``model`` hold an attention :func:`multi_head_attention_graph` rewrites?"""
    return any(n.op_type == "Softmax" for n in model.graph.node) and bool(_attentions(model))


def multi_head_attention_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with each plain attention as one ``MultiHeadAttention`` (see the module docstring);
    ``model`` itself when none matches. Weights are not read: external initializers stay where they are.

    >>> session_graph = multi_head_attention_graph(encoder_graph)  # doctest: +SKIP
    """
    found = _attentions(model)
    if not found:
        return model
    taken = {id(n) for attention in found for n in attention.nodes()}
    # the kernel goes where the last node it takes over was, in the graph's order (the merge back of its heads, which
    # reads every other): its inputs are made before that point and its output is read after it
    order = {id(n): i for i, n in enumerate(model.graph.node)}
    placed = {id(max(a.nodes(), key=lambda n: order[id(n)])): a for a in found}
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        attention = placed.get(id(node))
        if attention is not None:
            nodes.append(_kernel(attention))
        elif id(node) not in taken:
            nodes.append(node)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return out


def _kernel(attention: _Attention) -> onnx.NodeProto:
    scale = attention.query.factor * attention.key.factor
    name = attention.softmax.name or attention.softmax.output[0]
    return helper.make_node(
        "MultiHeadAttention",
        [attention.query.source, attention.key.source, attention.value.source],
        [attention.output],
        name=f"{_PREFIX}/{name}",
        domain="com.microsoft",
        num_heads=attention.heads,
        scale=scale,
    )


def _attentions(model: onnx.ModelProto) -> list[_Attention]:
    index = graph_index(model.graph)
    types = recorded_types(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    found = []
    for node in model.graph.node:
        if node.op_type == "Softmax" and node.domain in ("", "ai.onnx"):
            attention = _attention(node, index, types, opset)
            if attention is not None:
                found.append(attention)
    return found


def _attention(
    softmax: onnx.NodeProto, index: GraphIndex, types: dict[str, tuple[int, list[Dim]]], opset: int
) -> _Attention | None:
    scores = index.producer(softmax.input[0], "MatMul")
    product = index.only_reader(softmax.output[0], "MatMul")
    recorded = types.get(softmax.input[0])
    if scores is None or product is None or recorded is None or recorded[0] != TensorProto.FLOAT:
        return None
    rank = len(recorded[1])
    default = -1 if opset >= 13 else 1  # before opset 13, Softmax's axis defaults to 1
    axis = next((helper.get_attribute_value(a) for a in softmax.attribute if a.name == "axis"), default)
    if rank not in (3, 4) or axis not in (-1, rank - 1) or product.input[0] != softmax.output[0]:
        return None
    if index.reader_count(scores.output[0]) != 1 or scores.output[0] in index.outputs:
        return None
    query = _operand(scores.input[0], (0, 2, 1, 3), index, types)
    if query is None:
        return None
    key = _operand(scores.input[1], (0, 2, 3, 1), index, types, known_heads=query[1])
    value = _operand(product.input[1], (0, 2, 1, 3), index, types, scalars=False, known_heads=query[1])
    if key is None or value is None:
        return None
    heads = {q[1] for q in (query, key, value)}
    if len(heads) != 1:
        return None
    output = _output(product.output[0], heads.pop(), index, types)
    if output is None or query[0].factor * key[0].factor == 0:
        return None
    if not _same_rows(query[0].source, key[0].source, value[0].source, types):
        return None
    return _Attention(scores, softmax, product, query[0], key[0], value[0], output[0], output[1], query[1])


def _same_rows(query: str, key: str, value: str, types: dict[str, tuple[int, list[Dim]]]) -> bool:
    """The three sources share a batch, and the keys and values a number of steps (the kernel's own checks)."""
    recorded = [types.get(name) for name in (query, key, value)]
    if any(r is None or r[0] != TensorProto.FLOAT or len(r[1]) != 3 for r in recorded):
        return False  # a source without a recorded float32 [batch, steps, width] type is not taken
    q, k, v = (r[1] for r in recorded if r is not None)
    return q[0] == k[0] == v[0] and k[1] == v[1]


def _operand(
    name: str,
    layout: tuple[int, ...],
    index: GraphIndex,
    types: dict[str, tuple[int, list[Dim]]],
    *,
    scalars: bool = True,
    known_heads: int | None = None,
) -> tuple[_Operand, int] | None:
    """The [batch, steps, heads * dim] tensor that ``name`` splits into heads as ``layout`` says (the transposition of
    [batch, steps, heads, dim]: queries and values [batch, heads, steps, dim], keys [batch, heads, dim, steps]), with
    the chain between them and the heads; None when no chain leads to one."""
    if index.reader_count(name) != 1 or name in index.outputs:
        return None
    chain: list[onnx.NodeProto] = []
    factor = 1.0
    current = name
    for _ in range(_CHAIN):
        node = index.producers.get(current)
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if current in index.outputs or len([r for r in index.readers.get(current, ()) if r.op_type != "Shape"]) != 1:
            return None  # a tensor of the chain read elsewhere too (but by its shape) stays, and so does its node
        scalar = _scalar_factor(node, index) if scalars and node.op_type == "Mul" else None
        if node.op_type not in ("Reshape", "Transpose") and scalar is None:
            return None
        chain.insert(0, node)
        if scalar is not None:
            factor *= scalar[1]
        current = scalar[0] if scalar is not None else node.input[0]
        found = _splits(current, name, chain, layout, index, types, known_heads)
        if found is not None:
            heads, shape_nodes = found
            operand = _Operand(current, (*chain, *shape_nodes), factor)
            return (_with_scalar(operand, index) if scalars else operand), heads
    return None


def _with_scalar(operand: _Operand, index: GraphIndex) -> _Operand:
    """``operand`` with the scalar ``Mul`` that makes its source (a query scaled before its split into heads) taken
    into the kernel's scale, when nothing else reads the product."""
    node = index.producer(operand.source, "Mul")
    scalar = _scalar_factor(node, index) if node is not None else None
    if node is None or scalar is None or index.reader_count(operand.source) != 1 or operand.source in index.outputs:
        return operand
    return _Operand(scalar[0], (node, *operand.nodes), operand.factor * scalar[1])


def _scalar_factor(node: onnx.NodeProto, index: GraphIndex) -> tuple[str, float] | None:
    """The other input of a ``Mul`` by a float32 constant of one element, and that constant."""
    for mine, other in ((0, 1), (1, 0)):
        constant = inline_constant(index, node.input[other])
        if constant is not None and constant.data_type == TensorProto.FLOAT and math.prod(constant.dims) == 1:
            array = numpy_helper.to_array(constant)
            if array.size == 1 and array.ndim <= 1 and math.isfinite(float(array.reshape(-1)[0])):
                return node.input[mine], float(array.reshape(-1)[0])
    return None


def _splits(
    source: str,
    operand: str,
    chain: list[onnx.NodeProto],
    layout: tuple[int, ...],
    index: GraphIndex,
    types: dict[str, tuple[int, list[Dim]]],
    known_heads: int | None,
) -> tuple[int, tuple[onnx.NodeProto, ...]] | None:
    """The heads and the chain's shape nodes, when ``chain`` takes the float32 [batch, steps, heads * dim] tensor
    ``source`` to its split into heads in ``layout`` (the MatMul's operand rank 4, or rank 3 with batch and heads as
    one axis)."""
    recorded, result = types.get(source), types.get(operand)
    if recorded is None or recorded[0] != TensorProto.FLOAT or len(recorded[1]) != 3:
        return None
    dims: list[Dim] = result[1] if result is not None and len(result[1]) in (3, 4) else [None] * 4
    heads = dims[1] if len(dims) == 4 else None
    if len(dims) == 3 and isinstance(dims[0], int) and isinstance(recorded[1][0], int) and recorded[1][0] > 0:
        heads = dims[0] // recorded[1][0]
    heads = heads if isinstance(heads, int) else known_heads  # a shape computed at run time: the queries' heads
    width = recorded[1][2]
    if not isinstance(heads, int) or not isinstance(width, int) or heads <= 0 or width % heads:
        return None
    steps = dims[layout.index(1)] if len(dims) == 4 else dims[layout.index(1) - 1]
    size = dims[layout.index(3) - (4 - len(dims))]
    if (size is not None and size != width // heads) or (steps is not None and steps != recorded[1][1]):
        return None  # not the steps and head size of this source: no need to run the chain
    moved = chain_moves(source, chain, index, {name: len(dims) for name, (_, dims) in types.items()})
    if moved is None:
        return None
    moves, shape_nodes = moved
    if all(splits_as(concrete(recorded[1], sizes), moves, heads, layout) for sizes in tried_sizes(recorded[1])):
        return heads, shape_nodes
    return None


def _output(
    name: str, heads: int, index: GraphIndex, types: dict[str, tuple[int, list[Dim]]]
) -> tuple[str, tuple[onnx.NodeProto, ...]] | None:
    """The [batch, steps, heads * dim] tensor that the attention's output ``name`` ([batch, heads, steps, dim], or
    batch and heads as one axis) is merged into by a chain of reshapes and transposes, and that chain (with the nodes
    computing its shapes)."""
    made = types.get(name)
    if made is None or len(made[1]) not in (3, 4):
        return None
    ranks = {n: len(dims) for n, (_, dims) in types.items()}
    chain: list[onnx.NodeProto] = []
    current = name
    for _ in range(_CHAIN):
        readers = [r for r in index.readers.get(current, ()) if r.op_type != "Shape"]
        node = readers[0] if len(readers) == 1 and current not in index.outputs else None
        if node is None or node.op_type not in ("Reshape", "Transpose") or node.input[0] != current:
            return None
        chain.append(node)
        current = node.output[0]
        merged = types.get(current)
        if merged is None or merged[0] != TensorProto.FLOAT or len(merged[1]) != 3:
            continue
        width = merged[1][2]
        if not isinstance(width, int) or width % heads:
            continue
        moved = chain_moves(name, chain, index, ranks)
        if moved is None:
            continue
        moves, shape_nodes = moved
        taken = {id(n) for n in (*chain, *shape_nodes)}
        if not all(id(r) in taken for r in index.readers.get(name, ())):
            return None  # the attention's output read by more than the chain
        sizes = tried_sizes(merged[1])
        if all(merges_as(concrete(merged[1], s), moves, heads, len(made[1])) for s in sizes):
            return current, (*chain, *shape_nodes)
    return None
