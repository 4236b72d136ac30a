"""The kernel's own rotation and packed projections for :mod:`pipeline.runtime.ort.grouped_attention`:
``GroupQueryAttention`` rotates the queries and keys itself (``do_rotary``, as ONNX Runtime GenAI's graphs have it)
from cos/sin tables of every cache position at the model's own ``position_ids`` (each row's, the prompt's too:
``query_seqlens`` given), in place of the model's ``RotaryEmbedding`` nodes, where that is exactly the model's
rotation (:func:`rotation_of`); and it reads a merged q/k/v projection packed, without its ``Split``
(:func:`pack_projections`; not a float32 one, which the prepacked session runs as three MatMuls)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.runtime.ort.cached_attention import PREFIX, Around, Triple, merged_heads
from pipeline.runtime.ort.graph_index import const, graph_index
from pipeline.runtime.ort.recorded_types import Dim, dim_size, same_dim


@functools.cache
def kernel_inputs() -> tuple[str, ...]:
    """The input names of the installed ONNX Runtime's ``GroupQueryAttention`` (its schema); empty when unreadable."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        for schema in state.get_all_operator_schema():
            if schema.name == "GroupQueryAttention" and schema.domain == "com.microsoft":
                return tuple(i.name for i in schema.inputs)
    except Exception:  # noqa: BLE001 -- no schema to read: the rotation stays outside the kernel
        pass
    return ()


def kernel_rotates() -> bool:
    """Does the installed ``GroupQueryAttention`` take ``position_ids`` and ``query_seqlens``, the two inputs that let
    it rotate each row at the model's own positions (:func:`rotation_of`)?"""
    names = kernel_inputs()
    return names[7:11] == ("cos_cache", "sin_cache", "position_ids", "attention_bias") and "query_seqlens" in names


@dataclass
class Rotation:
    """A rotation of queries and keys the kernel does itself (``do_rotary``) instead of the model's
    ``RotaryEmbedding`` nodes (:func:`rotation_of`): their caches [batch, steps, rotated dim / 2], the graph input of
    positions they are made of, and the chains of elementwise nodes that make them from it."""

    index: int
    cos: str
    sin: str
    interleaved: int
    positions: str
    position_type: int
    capacity: int
    chains: tuple[list[onnx.NodeProto], list[onnx.NodeProto]]
    made: bool = False  #: its tables are in the new graph (:func:`table_nodes`)

    @property
    def cos_cache(self) -> str:
        """The name of the kernel's cosine table [capacity, dim / 2] in the new graph."""
        return f"{PREFIX}/rotary{self.index}/cos_cache"

    @property
    def sin_cache(self) -> str:
        """The name of the kernel's sine table [capacity, dim / 2] in the new graph."""
        return f"{PREFIX}/rotary{self.index}/sin_cache"

    @property
    def position_ids(self) -> str:
        """The positions as the kernel takes them (int64): the input itself, or its cast."""
        int64 = self.position_type == TensorProto.INT64
        return self.positions if int64 else f"{PREFIX}/rotary{self.index}/position_ids"


def rotation_of(
    triple: Triple,
    around: Around,
    types: dict[str, tuple[int, list[Dim]]],
    rotations: dict[tuple[str, str], Rotation],
) -> Rotation | None:
    """The layer's rotation as the kernel's own (``do_rotary``), when that is exactly the model's; None otherwise.

    The model rotates the layer's queries and keys with ``RotaryEmbedding(x, cos, sin)`` over caches [batch, steps,
    dim / 2] made per token from a positions input [batch, steps]. The kernel looks its caches up by position in
    tables [positions, dim / 2] (``cos_cache``, ``sin_cache``), at the model's own positions (``position_ids``,
    honoured row by row in every step, the prompt included, when ``query_seqlens`` is given; without it the kernel
    takes a prompt's positions from its first row's first position: not a left-padded batch's; a position past the
    tables is an error). Its rotation is the same code as ``RotaryEmbedding``'s (bit for bit the same numbers on ONNX
    Runtime 1.32), so it is the model's when the tables hold what the model's caches hold at each position. That is
    certain when the caches are made from the positions by elementwise nodes only (``Cast``, ``Unsqueeze`` of new
    last axes, ``Mul``/``Add``/``Sub``/``Div`` by constants broadcast over the last axes, ``Cos``, ``Sin``, ...: the
    Llama family's ``cos(position * inv_freq)``, scaled or not): the tables are those nodes again over the positions
    0 to capacity - 1 (constants, which ONNX Runtime folds when it loads the session). Anything else (a fourth
    ``RotaryEmbedding`` input, partial rotation, positions made in the graph), and heads the kernel cannot rotate
    (not a multiple of 16), keep the rotation outside."""
    attention, key_write = triple.attention, triple.key_write
    shapes = around.shapes
    query_shape, cache = shapes.get(attention.input[0]) or [], shapes.get(key_write.input[0]) or []
    if len(query_shape) != 4 or len(cache) != 4:
        return None
    heads, kv_heads, capacity, dim = dim_size(query_shape[1]), *(dim_size(d) for d in cache[1:4])
    if heads is None or kv_heads is None or capacity is None or dim is None or dim % 16:
        return None
    query = merged_heads(attention.input[0], heads, around)
    key = merged_heads(key_write.input[1], kv_heads, around)
    if query is None or key is None or query[1] is None or key[1] is None:
        return None
    rotaries = (query[1], key[1])
    if any(len(r.input) != 3 or r.input[1:] != rotaries[0].input[1:] for r in rotaries):
        return None  # a fourth input (position ids into 2-D caches) is another form
    attrs = [{a.name: helper.get_attribute_value(a) for a in r.attribute} for r in rotaries]
    interleaved = int(attrs[0].get("interleaved", 0))
    if any(int(a.get("interleaved", 0)) != interleaved or int(a.get("rotary_embedding_dim", 0)) for a in attrs):
        return None
    cos, sin = rotaries[0].input[1], rotaries[0].input[2]
    if (cos, sin) in rotations:
        known = rotations[cos, sin]
        return known if known.capacity == capacity else None
    chains = [_position_chain(name, around) for name in (cos, sin)]
    if chains[0] is None or chains[1] is None or chains[0][0] != chains[1][0]:
        return None
    positions = chains[0][0]
    position_type = types.get(positions, (0, []))[0]
    steps = around.shapes.get("input_ids") or []
    if (
        position_type not in (TensorProto.INT64, TensorProto.INT32)
        or chains[0][2] != 3
        or chains[1][2] != 3
        or len(steps) != 2
        or not all(same_dim(a, b) for a, b in zip(around.shapes.get(positions) or [], steps, strict=False))
    ):
        return None
    found = Rotation(
        len(rotations), cos, sin, interleaved, positions, position_type, capacity, (chains[0][1], chains[1][1])
    )
    rotations[cos, sin] = found
    return found


_UNARY = frozenset({"Cast", "Cos", "Sin", "Neg", "Identity"})
_BINARY = frozenset({"Mul", "Add", "Sub", "Div"})


def _position_chain(name: str, around: Around, depth: int = 16) -> tuple[str, list[onnx.NodeProto], int] | None:
    """The graph input [batch, steps] ``name`` is made of by elementwise nodes that keep each (row, step)'s values
    its own (see :func:`rotation_of`), those nodes in order, and the rank of ``name``; None when made otherwise."""
    if name in around.inputs:
        return (name, [], 2) if len(around.shapes.get(name) or []) == 2 else None
    node = around.producers.get(name)
    if node is None or depth == 0 or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    if node.op_type in _UNARY or node.op_type == "Unsqueeze":
        source = node.input[0]
    elif node.op_type in _BINARY and len(node.input) == 2:
        varying = [i for i in node.input if i not in around.constants]
        if len(varying) != 1:
            return None
        source = varying[0]
    else:
        return None
    found = _position_chain(source, around, depth - 1)
    if found is None:
        return None
    root, chain, rank = found
    if node.op_type == "Unsqueeze":
        axes = _constant(node.input[1], around) if len(node.input) > 1 else None
        if axes is None:
            axes = np.asarray(next((a.ints for a in node.attribute if a.name == "axes"), []), np.int64)
        rank += int(axes.size)
        if not axes.size or any((int(a) + rank if a < 0 else int(a)) < 2 for a in axes.reshape(-1)):
            return None  # a new axis among [batch, steps]
    elif node.op_type in _BINARY:
        constant = node.input[1] if node.input[0] == source else node.input[0]
        dims = list(around.constants[constant].dims)
        lead = rank - len(dims)  # the constant's first axis, aligned from the right
        if lead < 0 or any(axis >= lead and dims[axis - lead] != 1 for axis in (0, 1)):
            return None  # broadcast over the rows or the steps: not one value per (row, step)
    return root, [*chain, node], rank


def _constant(name: str, around: Around) -> np.ndarray | None:
    """The values of a small inline constant (an initializer or a ``Constant`` node's), else None."""
    tensor = around.constants.get(name)
    if tensor is None or tensor.data_location == TensorProto.EXTERNAL or int(np.prod(tensor.dims)) > 64:
        return None
    return numpy_helper.to_array(tensor)


def table_nodes(rotation: Rotation, first: bool) -> list[onnx.NodeProto]:
    """The kernel's tables of ``rotation`` (cos and sin [capacity, dim / 2]: the model's nodes again, over the positions
    0 to capacity - 1), its positions as int64, and (``first``: once per graph) ``{p}/query_seqlens`` (each row's new
    tokens: the step's, int32 [batch])."""
    p = f"{PREFIX}/rotary{rotation.index}"
    table = f"{p}/positions"
    values = np.arange(rotation.capacity).reshape(1, -1)
    nodes = [const(table, values, helper.tensor_dtype_to_np_dtype(rotation.position_type).type)]
    renamed = {rotation.positions: table}
    for chain in rotation.chains:
        for node in chain:
            if node.output[0] in renamed:
                continue  # the part the cos and sin chains share
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{p}/table/{len(renamed)}"
            del copy.input[:], copy.output[:], copy.metadata_props[:]
            copy.input.extend(renamed.get(i, i) for i in node.input)
            copy.output.append(copy.name)
            renamed[node.output[0]] = copy.name
            nodes.append(copy)
    nodes.append(const(f"{p}/first", [0]))
    for source, cache in ((rotation.cos, rotation.cos_cache), (rotation.sin, rotation.sin_cache)):
        nodes.append(helper.make_node("Squeeze", [renamed[source], f"{p}/first"], [cache], name=cache))
    if rotation.position_ids != rotation.positions:  # the kernel's positions are int64
        name = rotation.position_ids
        nodes.append(helper.make_node("Cast", [rotation.positions], [name], name=name, to=TensorProto.INT64))
    if first:
        q = f"{PREFIX}/query_seqlens"
        nodes.append(helper.make_node("Cast", [f"{PREFIX}/steps"], [f"{q}32"], name=f"{q}32", to=TensorProto.INT32))
        nodes.append(helper.make_node("Expand", [f"{q}32", f"{PREFIX}/batch"], [q], name=q))
    return nodes


def pack_projections(graph: onnx.GraphProto) -> bool:
    """Each rewritten layer whose queries, keys and values are the three parts of one ``Split`` (the merged q/k/v
    projection) of its last axis, read by nothing else, reads the packed projection instead ([batch, steps, (heads
    + 2 * kv heads) * dim], ``key`` and ``value`` empty): the ``Split`` falls out. Any rewritten?

    Not a float32 ``MatMul`` over a constant 2-D weight: ONNX Runtime's prepacked session of a float32 step runs
    that projection as three MatMuls instead (:mod:`pipeline.runtime.ort.projections`, which finds it by its
    ``Split``), measured faster there than the merged one; 4-bit weights (``MatMulNBits``) are read packed."""
    index = graph_index(graph)
    producers, constants = index.producers, index.constants
    caches = {i.name: i.type.tensor_type.shape.dim for i in graph.input}
    weights = {i.name: (i.data_type, len(i.dims)) for i in graph.initializer}
    packed = False
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or not node.name.startswith(PREFIX) or not node.input[1]:
            continue
        parts = list(node.input[:3])
        split = producers.get(parts[0])
        if (
            split is None
            or split.op_type != "Split"
            or split.domain not in ("", "ai.onnx")
            or list(split.output) != parts
        ):
            continue
        if any(index.reader_count(name) != 1 or name in index.outputs for name in parts):
            continue
        if _float_projection(producers.get(split.input[0]), weights):
            continue  # run apart in the prepacked session
        attrs = {a.name: helper.get_attribute_value(a) for a in split.attribute}
        sizes = attrs.get("split")
        if len(split.input) > 1 and split.input[1] in constants:
            sizes = numpy_helper.to_array(constants[split.input[1]]).reshape(-1).tolist()
        heads = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        dim = caches[node.input[3]][3].dim_value if node.input[3] in caches else 0
        expected = [heads["num_heads"] * dim, heads["kv_num_heads"] * dim, heads["kv_num_heads"] * dim]
        if attrs.get("axis", 0) not in (-1, 2) or sizes is None or [int(s) for s in sizes] != expected or not dim:
            continue
        node.input[0], node.input[1], node.input[2] = split.input[0], "", ""
        packed = True
    return packed


def _float_projection(node: onnx.NodeProto | None, weights: dict[str, tuple[int, int]]) -> bool:
    """Is ``node`` a ``MatMul`` over a float32 2-D initializer (a projection the prepacked session runs apart)?"""
    return (
        node is not None
        and node.op_type == "MatMul"
        and node.domain in ("", "ai.onnx")
        and weights.get(node.input[1]) == (TensorProto.FLOAT, 2)
    )
