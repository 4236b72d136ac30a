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
  rotation; and it reads a merged q/k/v projection packed, without its ``Split`` (not a float32 one, which the
  prepacked session runs as three MatMuls): :mod:`pipeline.runtime.ort.kernel_rotation`.

Only float32 graphs on the CPU provider of ONNX Runtime 1.22 or later are rewritten (the float16 graph runs as its
float32 emulation there); a triple that does not match exactly (another consumer of the written cache, a mask that is
not boolean, an attribute the kernel lacks) is left as it is.
The session's graph only: ``module.onnx`` stays standard ONNX.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from pipeline.runtime.ort.cached_attention import PREFIX, Around, Triple, around_of, merged_heads, triples
from pipeline.runtime.ort.graph_index import const, perm
from pipeline.runtime.ort.kernel_rotation import (
    Rotation,
    kernel_inputs,
    kernel_rotates,
    pack_projections,
    rotation_of,
    table_nodes,
)
from pipeline.runtime.ort.recorded_types import Dim, dim_size, recorded_types, same_dim

#: ONNX Runtime takes ``GroupQueryAttention``'s ``attention_bias`` input (the model's mask) from 1.22.
MINIMUM_ORT = (1, 22)


def kernel_available() -> bool:
    """Does the installed ONNX Runtime's ``GroupQueryAttention`` take the ``attention_bias`` this rewrite passes?"""
    import onnxruntime as ort

    release = tuple(int(p) for p in ort.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    return release >= MINIMUM_ORT


def grouped_attention_graph(model: onnx.ModelProto, fused: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` whose cached attention runs as ``GroupQueryAttention`` (see the module docstring);
    ``model`` itself when nothing matches. Weights are not read: external initializers stay where they are.

    ``fused``: the kernel rotates the queries and keys itself and reads the packed q/k/v projection wherever that is
    exactly the model's computation (:mod:`pipeline.runtime.ort.kernel_rotation`); False keeps the model's
    ``RotaryEmbedding`` nodes and its q/k/v ``Split`` before the kernel (the same numbers, more nodes)."""
    found = triples(model)
    if not found:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    around = around_of(model)
    writes = {id(n) for t in found for n in (t.key_write, t.value_write)}
    layers = {id(t.attention): (i, t) for i, t in enumerate(found)}
    biases: dict[str, str] = {}
    types = {**{i.name: (i.data_type, list(i.dims)) for i in model.graph.initializer}, **recorded_types(model)}
    rotations: dict[tuple[str, str], Rotation] = {}
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
        rotation = rotation_of(triple, around, types, rotations) if rotates else None
        if rotation is not None and not rotation.made:
            nodes.extend(table_nodes(rotation, rotation.index == 0))
            rotation.made = True
        nodes.extend(_attention_nodes(triple, index, around, biases[mask], rotation))
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_dead_nodes(graph)
    if fused and pack_projections(graph):
        _drop_dead_nodes(graph)  # the q/k/v Splits the kernel now reads packed
    if not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return out


def _length_nodes() -> list[onnx.NodeProto]:
    """``{p}/total64`` [1] int64 (past_length + steps), ``{p}/total`` [] int32, ``{p}/seqlens`` [batch] int32.

    Seven nodes run on every step: ``past_length`` (0-d) broadcasts in the ``Add``, and the one cast to int32
    serves both the total and the rows' lengths."""
    p = PREFIX
    return [
        helper.make_node("Shape", ["input_ids"], [f"{p}/steps"], name=f"{p}/steps", start=1, end=2),
        helper.make_node("Shape", ["input_ids"], [f"{p}/batch"], name=f"{p}/batch", start=0, end=1),
        const(f"{p}/one", np.ones(1, np.int32), np.int32),
        const(f"{p}/scalar", np.zeros(0, np.int64)),
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
    p = f"{PREFIX}/bias{index}"
    lowest = np.array(np.finfo(np.float32).min, np.float32)
    cut = [
        const(f"{p}/zero_start", [0]),
        const(f"{p}/axis", [3]),
        helper.make_node(
            "Slice", [mask, f"{p}/zero_start", f"{PREFIX}/total64", f"{p}/axis"], [f"{p}/filled"], name=f"{p}/filled"
        ),
    ]
    if additive:
        return [*cut, helper.make_node("Identity", [f"{p}/filled"], [f"{p}/bias"], name=f"{p}/bias")]
    return [
        *cut,
        const(f"{p}/zero", np.array(0.0, np.float32), np.float32),
        const(f"{p}/lowest", lowest, np.float32),
        helper.make_node("Where", [f"{p}/filled", f"{p}/zero", f"{p}/lowest"], [f"{p}/bias"], name=f"{p}/bias"),
    ]


def _attention_nodes(
    triple: Triple, index: int, around: Around, bias: str, rotation: Rotation | None = None
) -> list[onnx.NodeProto]:
    """The layer's ``GroupQueryAttention``; its outputs keep the old names.

    The kernel takes queries, keys and values as [batch, steps, heads * dim] and returns that layout. Where the
    model split its projections into heads itself (``Reshape`` to [batch, steps, heads, dim], ``Transpose``, and
    perhaps ``RotaryEmbedding``), the kernel reads the projections as they are: rotated by the kernel itself
    (``do_rotary``, ``rotation``: :mod:`~pipeline.runtime.ort.kernel_rotation`), or else by the model's rotation done
    again on their three-dimensional form; where the model merges the heads back (``Transpose``, ``Reshape`` to
    [batch, steps, heads * dim]), the kernel's output takes the merged tensor's place. Anything else goes through a
    ``Transpose`` and a ``Reshape`` each way."""
    p = f"{PREFIX}/layer{index}"
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
            nodes.insert(0, const(f"{p}/flat", [0, 0, -1]))
        nodes.append(
            helper.make_node("Transpose", [name], [f"{p}/{role}_bsnh"], name=f"{p}/{role}_t", perm=[0, 2, 1, 3])
        )
        nodes.append(
            helper.make_node("Reshape", [f"{p}/{role}_bsnh", f"{p}/flat"], [f"{p}/{role}"], name=f"{p}/{role}")
        )
        flat.append(f"{p}/{role}")
    inputs = [*flat, past_key, past_value, f"{PREFIX}/seqlens", f"{PREFIX}/total", "", "", "", bias]
    if rotation is not None:
        inputs[7:10] = [rotation.cos_cache, rotation.sin_cache, rotation.position_ids]
        seqlens_at = kernel_inputs().index("query_seqlens")
        inputs += [""] * (seqlens_at + 1 - len(inputs))
        inputs[seqlens_at] = f"{PREFIX}/query_seqlens"
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
        nodes.append(const(f"{p}/split", [0, 0, int(heads), int(value_dim)]))
        nodes.append(helper.make_node("Reshape", [f"{p}/out", f"{p}/split"], [f"{p}/out4"], name=f"{p}/out4"))
        nodes.append(
            helper.make_node("Transpose", [f"{p}/out4"], [attention.output[0]], name=f"{p}/out_t", perm=[0, 2, 1, 3])
        )
    return nodes


def _merged_heads_input(
    name: str, heads: int, out: str, around: Around, rotated: bool = False
) -> tuple[list[onnx.NodeProto], str] | None:
    """``name`` [batch, heads, steps, dim] as [batch, steps, heads * dim] without moving data, when the model made it
    from such a tensor (:func:`~pipeline.runtime.ort.cached_attention.merged_heads`), perhaps then rotated
    (``RotaryEmbedding``, done again on the merged tensor with ``num_heads``, unless the kernel ``rotated`` it itself:
    :mod:`~pipeline.runtime.ort.kernel_rotation`): the nodes to add and the name."""
    found = merged_heads(name, heads, around)
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


def _merged_heads_output(attention: onnx.NodeProto, width: int, around: Around) -> str | None:
    """The name of the model's [batch, steps, heads * dim] merge of the attention's output (its only reader a
    ``Transpose`` to [batch, steps, heads, dim], whose only reader a ``Reshape`` to the merged width), which the
    kernel's own output replaces (the two nodes are skipped); ``None`` when the model does something else."""
    transpose = around.only_reader(attention.output[0], "Transpose")
    if transpose is None or perm(transpose) != [0, 2, 1, 3]:
        return None
    reshape = around.only_reader(transpose.output[0], "Reshape")
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
