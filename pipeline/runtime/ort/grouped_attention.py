"""The cached decoder step as ONNX Runtime's CPU kernels like it: ``com.microsoft::GroupQueryAttention`` over the
filled part of the cache.

The step graph (``module.onnx``, TensorRT's graph) writes each layer's new keys and values into the static cache
with ``TensorScatter`` and attends over the whole capacity with ONNX ``Attention`` and an explicit boolean mask:
every decode step costs what ``max_length`` costs. ONNX Runtime's ``GroupQueryAttention`` takes the cache buffer as
``past_key``/``past_value``, writes the new positions into it (in place when ``present`` is bound to the same buffer,
as :class:`~pipeline.runtime.generation.runners.OrtBoundRunner` binds it) and reads only the first
``total_sequence_length`` positions. :func:`grouped_attention_graph` replaces each
``TensorScatter(key) + TensorScatter(value) + Attention`` triple with one such node:

- ``seqlens_k`` (each row's filled length minus one) and ``total_sequence_length`` are ``past_length`` plus the
  step's tokens: the step writes every row at the same position, so the rows share one length;
- the model's boolean mask (padding, sliding windows, whatever the model built) is sliced to the filled length and
  passed as the additive ``attention_bias``; the kernel's own causal mask agrees with it (the model is causal, and the
  mask always lets a query see its own position);
- queries, keys and values go from [batch, heads, steps, dim] to the kernel's [batch, steps, heads * dim], and the
  output comes back as the ``Attention`` output was;
- the kernel rotates the queries and keys itself (``do_rotary``, as ONNX Runtime GenAI's graphs have it) in place of
  the model's ``RotaryEmbedding`` nodes, from cos/sin tables of every cache position at the model's own
  ``position_ids`` (each row's, the prompt's too: ``query_seqlens`` given), where that is exactly the model's
  rotation (:func:`_rotation`); and it reads a merged q/k/v projection packed, without its ``Split``
  (:func:`_pack_projections`; not a float32 one, which the prepacked session runs as three MatMuls).

Only float32 graphs on the CPU provider of ONNX Runtime 1.22 or later are rewritten (the float16 graph runs as its
float32 emulation there); a triple that does not match exactly (another consumer of the written cache, a mask that is
not boolean, an attribute the kernel lacks) is left as it is.
The session's graph only: ``module.onnx`` stays standard ONNX.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.runtime.ort.recorded_types import Dim, dim_size, recorded_types, same_dim, shapes_of

#: The attribute names of ONNX ``Attention`` this rewrite carries over (any other one keeps the node as it is).
_CARRIED = frozenset({"scale", "softcap"})
_PREFIX = "ort_gqa"


@dataclass(frozen=True)
class _Triple:
    attention: onnx.NodeProto
    key_write: onnx.NodeProto
    value_write: onnx.NodeProto


#: ONNX Runtime takes ``GroupQueryAttention``'s ``attention_bias`` input (the model's mask) from 1.22.
MINIMUM_ORT = (1, 22)


def kernel_available() -> bool:
    """Does the installed ONNX Runtime's ``GroupQueryAttention`` take the ``attention_bias`` this rewrite passes?"""
    import onnxruntime as ort

    release = tuple(int(p) for p in ort.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    return release >= MINIMUM_ORT


@functools.cache
def _kernel_inputs() -> tuple[str, ...]:
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
    it rotate each row at the model's own positions (:func:`_rotation`)?"""
    names = _kernel_inputs()
    return names[7:11] == ("cos_cache", "sin_cache", "position_ids", "attention_bias") and "query_seqlens" in names


def has_cached_attention(model: onnx.ModelProto) -> bool:
    """Does ``model`` hold a cached step's ``TensorScatter`` + ``Attention`` that :func:`grouped_attention_graph`
    can rewrite?"""
    return bool(_triples(model))


def grouped_attention_graph(model: onnx.ModelProto, fused: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` whose cached attention runs as ``GroupQueryAttention`` (see the module docstring);
    ``model`` itself when nothing matches. Weights are not read: external initializers stay where they are.

    ``fused``: the kernel rotates the queries and keys itself and reads the packed q/k/v projection wherever that is
    exactly the model's computation (:func:`_rotation`, :func:`_pack_projections`); False keeps the model's
    ``RotaryEmbedding`` nodes and its q/k/v ``Split`` before the kernel (the same numbers, more nodes)."""
    triples = _triples(model)
    if not triples:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    around = _Around(model)
    writes = {id(n) for t in triples for n in (t.key_write, t.value_write)}
    layers = {id(t.attention): (i, t) for i, t in enumerate(triples)}
    biases: dict[str, str] = {}
    types = {**{i.name: (i.data_type, list(i.dims)) for i in model.graph.initializer}, **recorded_types(model)}
    rotations: dict[tuple[str, str], _Rotation] = {}
    rotates = fused and kernel_rotates()
    nodes = _length_nodes()
    for node in model.graph.node:
        if id(node) in writes or id(node) in around.skipped:
            continue
        if id(node) not in layers:
            nodes.append(node)
            continue
        index, triple = layers[id(node)]
        mask = node.input[3]
        if mask not in biases:  # one bias per distinct mask (sliding-window layers have their own)
            additive = _elem_type(mask, around.producers, types) not in (TensorProto.BOOL, None)  # T5: a float mask
            bias = _bias_nodes(mask, len(biases), additive)
            nodes.extend(bias)
            biases[mask] = bias[-1].output[0]
        rotation = _rotation(triple, around, types, rotations) if rotates else None
        if rotation is not None and not rotation.made:
            nodes.extend(_table_nodes(rotation, rotation.index == 0))
            rotation.made = True
        nodes.extend(_attention_nodes(triple, index, around, biases[mask], rotation))
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_dead_nodes(graph)
    if fused and _pack_projections(graph):
        _drop_dead_nodes(graph)  # the q/k/v Splits the kernel now reads packed
    if not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return out


class _Around:
    """What surrounds the attention nodes in the original graph: producers, consumers, shapes, and the nodes a
    rewritten layer takes over (:attr:`skipped`: not copied into the new graph)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.producers = {o: n for n in model.graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in model.graph.output}
        self.inputs = {i.name: i for i in model.graph.input}
        self.shapes = shapes_of(model)
        self.skipped: set[int] = set()
        #: constant tensors (initializers and ``Constant`` nodes' values), by name: their values are read only for
        #: the small ones :func:`_constant` is asked for
        self.constants: dict[str, onnx.TensorProto] = {i.name: i for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = next((a for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self.constants[node.output[0]] = value.t

    def only_consumer(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The single node reading ``name`` when it is an ``op_type`` of the default domain (and ``name`` is not a
        graph output)."""
        readers = self.consumers.get(name, [])
        if name in self.outputs or len(readers) != 1:
            return None
        node = readers[0]
        return node if node.op_type == op_type and node.domain in ("", "ai.onnx") else None

    def producer(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The node making ``name`` when it is an ``op_type`` of the default domain."""
        node = self.producers.get(name)
        return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _triples(model: onnx.ModelProto) -> list[_Triple]:
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    inputs = {i.name: i for i in graph.input}
    if "past_length" not in inputs or "input_ids" not in inputs:
        return []
    found = []
    for node in graph.node:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx") or len(node.input) != 4:
            continue
        if any(a.name not in _CARRIED for a in node.attribute):
            continue
        writes = [producers.get(name) for name in node.input[1:3]]
        if not all(w is not None and w.op_type == "TensorScatter" for w in writes):
            continue
        key_write, value_write = writes
        assert key_write is not None and value_write is not None
        if not all(_is_cache_write(w, inputs, consumers) for w in (key_write, value_write)):
            continue
        if key_write.input[2] != value_write.input[2] and not _same_position(key_write, value_write, producers):
            continue
        found.append(_Triple(node, key_write, value_write))
    if found and not all(_rank4(inputs[t.key_write.input[0]]) for t in found):
        return []
    # the kernel's head size must be a multiple of 8 (ONNX Runtime refuses the node when run otherwise: a small
    # Moonshine's 4); such layers keep the standard TensorScatter + Attention
    return [t for t in found if _head_size(inputs[t.key_write.input[0]]) % 8 == 0]


def _head_size(cache: onnx.ValueInfoProto) -> int:
    """The last dimension of a rank-4 cache input [batch, heads, capacity, head size]."""
    return int(cache.type.tensor_type.shape.dim[3].dim_value)


def _is_cache_write(node: onnx.NodeProto, inputs: dict[str, onnx.ValueInfoProto], consumers: dict[str, int]) -> bool:
    cache = inputs.get(node.input[0])
    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), -2)
    return (
        cache is not None
        and cache.type.tensor_type.elem_type == TensorProto.FLOAT
        and axis in (-2, 2)
        and consumers.get(node.output[0], 0) == 1  # the attention only (and the graph output)
    )


def _same_position(a: onnx.NodeProto, b: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> bool:
    """Both writes index by ``past_length`` (the step's converter expands it per row for each write)."""
    return _reads_past_length(a.input[2], producers) and _reads_past_length(b.input[2], producers)


def _reads_past_length(name: str, producers: dict[str, onnx.NodeProto], depth: int = 4) -> bool:
    if name == "past_length":
        return True
    node = producers.get(name)
    if node is None or depth == 0:
        return False
    return any(_reads_past_length(i, producers, depth - 1) for i in node.input[:1])


def _rank4(value: onnx.ValueInfoProto) -> bool:
    dims = value.type.tensor_type.shape.dim
    return len(dims) == 4 and all(d.HasField("dim_value") for d in dims[1:])


def _const(name: str, values: Iterable[int] | np.ndarray, dtype: type = np.int64) -> onnx.NodeProto:
    array: np.ndarray = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=dtype)
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(array, name))


def _length_nodes() -> list[onnx.NodeProto]:
    """``{p}/total64`` [1] int64 (past_length + steps), ``{p}/total`` [] int32, ``{p}/seqlens`` [batch] int32.

    Seven nodes run on every step: ``past_length`` (0-d) broadcasts in the ``Add``, and the one cast to int32
    serves both the total and the rows' lengths."""
    p = _PREFIX
    return [
        helper.make_node("Shape", ["input_ids"], [f"{p}/steps"], name=f"{p}/steps", start=1, end=2),
        helper.make_node("Shape", ["input_ids"], [f"{p}/batch"], name=f"{p}/batch", start=0, end=1),
        _const(f"{p}/one", np.ones(1, np.int32), np.int32),
        _const(f"{p}/scalar", np.zeros(0, np.int64)),
        helper.make_node("Add", ["past_length", f"{p}/steps"], [f"{p}/total64"], name=f"{p}/total64"),
        helper.make_node("Cast", [f"{p}/total64"], [f"{p}/total1"], name=f"{p}/total1", to=TensorProto.INT32),
        helper.make_node("Reshape", [f"{p}/total1", f"{p}/scalar"], [f"{p}/total"], name=f"{p}/total"),
        helper.make_node("Sub", [f"{p}/total1", f"{p}/one"], [f"{p}/last"], name=f"{p}/last"),
        helper.make_node("Expand", [f"{p}/last", f"{p}/batch"], [f"{p}/seqlens"], name=f"{p}/seqlens"),
    ]


_BOOLEAN_OPS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Not", "Xor"})


def _elem_type(
    name: str, producers: dict[str, onnx.NodeProto], types: dict[str, tuple[int, list[Dim]]], depth: int = 8
) -> int | None:
    """The element type of ``name``: recorded, else followed through its producers (None: not found)."""
    if name in types and types[name][0]:
        return types[name][0]
    node = producers.get(name)
    if node is None or depth == 0:
        return None
    if node.op_type in _BOOLEAN_OPS:
        return TensorProto.BOOL
    if node.op_type == "Cast":
        return next(a.i for a in node.attribute if a.name == "to")
    if node.op_type == "Constant":
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        return value.data_type if value is not None else None
    sources = node.input[1:3] if node.op_type == "Where" else node.input[:1]
    for source in sources:
        found = _elem_type(source, producers, types, depth - 1) if source else None
        if found is not None:
            return found
    return None


def _bias_nodes(mask: str, index: int, additive: bool = False) -> list[onnx.NodeProto]:
    """The boolean mask [batch, 1, steps, capacity] cut to the filled length, as an additive float bias (an
    ``additive`` mask, already float, is only cut)."""
    p = f"{_PREFIX}/bias{index}"
    lowest = np.array(np.finfo(np.float32).min, np.float32)
    cut = [
        _const(f"{p}/zero_start", [0]),
        _const(f"{p}/axis", [3]),
        helper.make_node(
            "Slice", [mask, f"{p}/zero_start", f"{_PREFIX}/total64", f"{p}/axis"], [f"{p}/filled"], name=f"{p}/filled"
        ),
    ]
    if additive:
        return [*cut, helper.make_node("Identity", [f"{p}/filled"], [f"{p}/bias"], name=f"{p}/bias")]
    return [
        *cut,
        _const(f"{p}/zero", np.array(0.0, np.float32), np.float32),
        _const(f"{p}/lowest", lowest, np.float32),
        helper.make_node("Where", [f"{p}/filled", f"{p}/zero", f"{p}/lowest"], [f"{p}/bias"], name=f"{p}/bias"),
    ]


def _attention_nodes(
    triple: _Triple, index: int, around: _Around, bias: str, rotation: _Rotation | None = None
) -> list[onnx.NodeProto]:
    """The layer's ``GroupQueryAttention``; its outputs keep the old names.

    The kernel takes queries, keys and values as [batch, steps, heads * dim] and returns that layout. Where the
    model split its projections into heads itself (``Reshape`` to [batch, steps, heads, dim], ``Transpose``, and
    perhaps ``RotaryEmbedding``), the kernel reads the projections as they are: rotated by the kernel itself
    (``do_rotary``, ``rotation``: :func:`_rotation`), or else by the model's rotation done again on their
    three-dimensional form; where the model merges the heads back (``Transpose``, ``Reshape`` to [batch, steps,
    heads * dim]), the kernel's output takes the merged tensor's place. Anything else goes through a ``Transpose``
    and a ``Reshape`` each way."""
    p = f"{_PREFIX}/layer{index}"
    shapes = around.shapes
    attention, key_write, value_write = triple.attention, triple.key_write, triple.value_write
    query = attention.input[0]
    past_key, new_key = key_write.input[0], key_write.input[1]
    past_value, new_value = value_write.input[0], value_write.input[1]
    kv_heads = dim_size(shapes[past_key][1])
    query_shape = shapes.get(query) or []
    heads = dim_size(query_shape[1]) if len(query_shape) == 4 else None
    value_dim = dim_size((shapes.get(past_value) or [None] * 4)[3])
    if heads is None or kv_heads is None or value_dim is None:
        raise ValueError(f"{attention.name}: the query's heads or the cache's dims are not static")
    attrs = {a.name: helper.get_attribute_value(a) for a in attention.attribute}
    gqa_attrs: dict[str, Any] = {"num_heads": int(heads), "kv_num_heads": int(kv_heads)}
    if "scale" in attrs:
        gqa_attrs["scale"] = float(attrs["scale"])
    if float(attrs.get("softcap", 0.0)) > 0:
        gqa_attrs["softcap"] = float(attrs["softcap"])
    nodes: list[onnx.NodeProto] = []
    flat = []
    for role, name, count in (("q", query, heads), ("k", new_key, kv_heads), ("v", new_value, kv_heads)):
        taken = _merged_heads_input(name, count, f"{p}/{role}", around, rotated=rotation is not None and role != "v")
        if taken is not None:
            nodes.extend(taken[0])
            flat.append(taken[1])
            continue
        if not nodes or nodes[0].output[0] != f"{p}/flat":
            nodes.insert(0, _const(f"{p}/flat", [0, 0, -1]))
        nodes.append(
            helper.make_node("Transpose", [name], [f"{p}/{role}_bsnh"], name=f"{p}/{role}_t", perm=[0, 2, 1, 3])
        )
        nodes.append(
            helper.make_node("Reshape", [f"{p}/{role}_bsnh", f"{p}/flat"], [f"{p}/{role}"], name=f"{p}/{role}")
        )
        flat.append(f"{p}/{role}")
    inputs = [*flat, past_key, past_value, f"{_PREFIX}/seqlens", f"{_PREFIX}/total", "", "", "", bias]
    if rotation is not None:
        inputs[7:10] = [rotation.cos_cache, rotation.sin_cache, rotation.position_ids]
        seqlens_at = _kernel_inputs().index("query_seqlens")
        inputs += [""] * (seqlens_at + 1 - len(inputs))
        inputs[seqlens_at] = f"{_PREFIX}/query_seqlens"
        gqa_attrs["do_rotary"] = 1
        if rotation.interleaved:
            gqa_attrs["rotary_interleaved"] = 1
    merged = _merged_heads_output(attention, heads * value_dim, around)
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            inputs,
            [merged or f"{p}/out", key_write.output[0], value_write.output[0]],
            name=f"{p}/gqa",
            domain="com.microsoft",
            **gqa_attrs,
        )
    )
    if merged is None:
        nodes.append(_const(f"{p}/split", [0, 0, int(heads), int(value_dim)]))
        nodes.append(helper.make_node("Reshape", [f"{p}/out", f"{p}/split"], [f"{p}/out4"], name=f"{p}/out4"))
        nodes.append(
            helper.make_node("Transpose", [f"{p}/out4"], [attention.output[0]], name=f"{p}/out_t", perm=[0, 2, 1, 3])
        )
    return nodes


def _perm(node: onnx.NodeProto) -> list[int]:
    return next((list(helper.get_attribute_value(a)) for a in node.attribute if a.name == "perm"), [])


def _merged_heads(name: str, heads: int, around: _Around) -> tuple[str, onnx.NodeProto | None] | None:
    """The [batch, steps, heads * dim] tensor the model split into ``name`` [batch, heads, steps, dim] (``Reshape`` to
    [batch, steps, heads, dim], ``Transpose``), and the ``RotaryEmbedding`` it then applied (None: none)."""
    rotary = around.producer(name, "RotaryEmbedding")
    transpose = around.producer(rotary.input[0] if rotary is not None else name, "Transpose")
    if transpose is None or _perm(transpose) != [0, 2, 1, 3]:
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


def _merged_heads_input(
    name: str, heads: int, out: str, around: _Around, rotated: bool = False
) -> tuple[list[onnx.NodeProto], str] | None:
    """``name`` [batch, heads, steps, dim] as [batch, steps, heads * dim] without moving data, when the model made it
    from such a tensor (:func:`_merged_heads`), perhaps then rotated (``RotaryEmbedding``, done again on the merged
    tensor with ``num_heads``, unless the kernel ``rotated`` it itself: :func:`_rotation`): the nodes to add and the
    name."""
    found = _merged_heads(name, heads, around)
    if found is None:
        return None
    source, rotary = found
    if rotary is None or rotated:
        return [], source
    attrs = {a.name: helper.get_attribute_value(a) for a in rotary.attribute}
    if attrs.get("num_heads", heads) != heads:
        return None
    attrs["num_heads"] = heads
    node = helper.make_node("RotaryEmbedding", [source, *rotary.input[1:]], [out], name=out, **attrs)
    return [node], out


@dataclass
class _Rotation:
    """A rotation of queries and keys the kernel does itself (``do_rotary``) instead of the model's
    ``RotaryEmbedding`` nodes (:func:`_rotation`): their caches [batch, steps, rotated dim / 2], the graph input of
    positions they are made of, and the chains of elementwise nodes that make them from it."""

    index: int
    cos: str
    sin: str
    interleaved: int
    positions: str
    position_type: int
    capacity: int
    chains: tuple[list[onnx.NodeProto], list[onnx.NodeProto]]
    made: bool = False  #: its tables are in the new graph (:func:`_table_nodes`)

    @property
    def cos_cache(self) -> str:
        return f"{_PREFIX}/rotary{self.index}/cos_cache"

    @property
    def sin_cache(self) -> str:
        return f"{_PREFIX}/rotary{self.index}/sin_cache"

    @property
    def position_ids(self) -> str:
        """The positions as the kernel takes them (int64): the input itself, or its cast."""
        int64 = self.position_type == TensorProto.INT64
        return self.positions if int64 else f"{_PREFIX}/rotary{self.index}/position_ids"


def _rotation(
    triple: _Triple,
    around: _Around,
    types: dict[str, tuple[int, list[Dim]]],
    rotations: dict[tuple[str, str], _Rotation],
) -> _Rotation | None:
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
    query = _merged_heads(attention.input[0], heads, around)
    key = _merged_heads(key_write.input[1], kv_heads, around)
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
    rotation = _Rotation(
        len(rotations), cos, sin, interleaved, positions, position_type, capacity, (chains[0][1], chains[1][1])
    )
    rotations[cos, sin] = rotation
    return rotation


_UNARY = frozenset({"Cast", "Cos", "Sin", "Neg", "Identity"})
_BINARY = frozenset({"Mul", "Add", "Sub", "Div"})


def _position_chain(name: str, around: _Around, depth: int = 16) -> tuple[str, list[onnx.NodeProto], int] | None:
    """The graph input [batch, steps] ``name`` is made of by elementwise nodes that keep each (row, step)'s values
    its own (see :func:`_rotation`), those nodes in order, and the rank of ``name``; None when it is made otherwise."""
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


def _constant(name: str, around: _Around) -> np.ndarray | None:
    """The values of a small inline constant (an initializer or a ``Constant`` node's), else None."""
    tensor = around.constants.get(name)
    if tensor is None or tensor.data_location == TensorProto.EXTERNAL or int(np.prod(tensor.dims)) > 64:
        return None
    return numpy_helper.to_array(tensor)


def _table_nodes(rotation: _Rotation, first: bool) -> list[onnx.NodeProto]:
    """The kernel's tables of ``rotation`` (cos and sin [capacity, dim / 2]: the model's nodes again, over the positions
    0 to capacity - 1), its positions as int64, and (``first``: once per graph) ``{p}/query_seqlens`` (each row's new
    tokens: the step's, int32 [batch])."""
    p = f"{_PREFIX}/rotary{rotation.index}"
    table = f"{p}/positions"
    values = np.arange(rotation.capacity).reshape(1, -1)
    nodes = [_const(table, values, helper.tensor_dtype_to_np_dtype(rotation.position_type).type)]
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
    nodes.append(_const(f"{p}/first", [0]))
    for source, cache in ((rotation.cos, rotation.cos_cache), (rotation.sin, rotation.sin_cache)):
        nodes.append(helper.make_node("Squeeze", [renamed[source], f"{p}/first"], [cache], name=cache))
    if rotation.position_ids != rotation.positions:  # the kernel's positions are int64
        name = rotation.position_ids
        nodes.append(helper.make_node("Cast", [rotation.positions], [name], name=name, to=TensorProto.INT64))
    if first:
        q = f"{_PREFIX}/query_seqlens"
        nodes.append(helper.make_node("Cast", [f"{_PREFIX}/steps"], [f"{q}32"], name=f"{q}32", to=TensorProto.INT32))
        nodes.append(helper.make_node("Expand", [f"{q}32", f"{_PREFIX}/batch"], [q], name=q))
    return nodes


def _pack_projections(graph: onnx.GraphProto) -> bool:
    """Each rewritten layer whose queries, keys and values are the three parts of one ``Split`` (the merged q/k/v
    projection) of its last axis, read by nothing else, reads the packed projection instead ([batch, steps, (heads
    + 2 * kv heads) * dim], ``key`` and ``value`` empty): the ``Split`` falls out. Any rewritten?

    Not a float32 ``MatMul`` over a constant 2-D weight: ONNX Runtime's prepacked session of a float32 step runs
    that projection as three MatMuls instead (:mod:`pipeline.runtime.ort.projections`, which finds it by its
    ``Split``), measured faster there than the merged one; 4-bit weights (``MatMulNBits``) are read packed."""
    producers = {o: n for n in graph.node for o in n.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    constants = {i.name: i for i in graph.initializer}
    constants.update(
        (n.output[0], a.t) for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"
    )
    caches = {i.name: i.type.tensor_type.shape.dim for i in graph.input}
    weights = {i.name: (i.data_type, len(i.dims)) for i in graph.initializer}
    packed = False
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or not node.name.startswith(_PREFIX) or not node.input[1]:
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
        if any(readers.get(name) != 1 or name in outputs for name in parts):
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


def _merged_heads_output(attention: onnx.NodeProto, width: int, around: _Around) -> str | None:
    """The name of the model's [batch, steps, heads * dim] merge of the attention's output (its only reader a
    ``Transpose`` to [batch, steps, heads, dim], whose only reader a ``Reshape`` to the merged width), which the
    kernel's own output replaces (the two nodes are skipped); ``None`` when the model does something else."""
    transpose = around.only_consumer(attention.output[0], "Transpose")
    if transpose is None or _perm(transpose) != [0, 2, 1, 3]:
        return None
    reshape = around.only_consumer(transpose.output[0], "Reshape")
    if reshape is None or reshape.input[0] != transpose.output[0]:
        return None
    split, merged = around.shapes.get(transpose.output[0]) or [], around.shapes.get(reshape.output[0]) or []
    if (
        len(split) != 4
        or len(merged) != 3
        or not (same_dim(split[0], merged[0]) and same_dim(split[1], merged[1]))
        or dim_size(merged[2]) != width
    ):
        return None
    around.skipped.update((id(transpose), id(reshape)))
    return reshape.output[0]


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove nodes none of whose outputs is read or returned (the writes' index computations)."""
    outputs = {o.name for o in graph.output}
    while True:
        used = {name for node in graph.node for name in node.input} | outputs
        dead = [i for i, node in enumerate(graph.node) if not any(o in used for o in node.output)]
        if not dead:
            return
        for i in reversed(dead):
            del graph.node[i]
