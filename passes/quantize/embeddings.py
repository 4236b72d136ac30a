"""4-bit embedding tables (``quantize_embeddings=True``): a ``Gather`` of a constant ``[V, D]`` table reads it
through the same DequantizeLinear chain as a 4-bit weight (:func:`passes.quantize.weight_only.dequantized_weight`),
blocked along ``D``: ``DequantizeLinear(int4 [V, D], scale [V, D / B], axis=1, block_size=B) -> Gather`` (NVFP4:
the two-level chain). That order is the one both judges take: measured with TensorRT-RTX 1.7.1 and ONNX Runtime
1.32, ``Gather`` of the INT4 table then DequantizeLinear is refused by both (TensorRT: "Tensor ... has datatype
Int4 but is not consumed by ... IDequantizeLayer"; ONNX Runtime: Gather has no int4 type).

A head tied to the table (the exporter writes its weight as a separate constant ``[D, V]`` equal to the table
transposed, or ``[V, D]`` under a ``Gemm`` with ``transB=1``) reads the same dequantized table (through a
``Transpose`` for a MatMul: ONNX Runtime GenAI's ``[N, K], axis=1 -> Transpose -> MatMul`` form, which TensorRT-RTX
builds for compute capability 8.0 and later), so the table is stored once, in 4 bits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.quantize.blockwise import BlockFormat, quantize
from passes.quantize.placement import Target
from passes.quantize.weight_only import dequantized_weight
from passes.records import QuantizedOp, Skipped


@dataclass(frozen=True)
class Table:
    """A Gather of a constant embedding table, and the MatMul/Gemm heads whose weight is the same table."""

    node: str
    tied: tuple[str, ...]


def find_tables(graph: gs.Graph, block: int) -> tuple[list[Table], list[Skipped]]:
    """The Gather nodes of a 2-D float constant along axis 0 whose width is a multiple of ``block``, with their tied
    heads, and the other such Gathers (with the reason)."""
    tables: list[Table] = []
    skipped: list[Skipped] = []
    for node in graph.nodes:
        data = node.inputs[0] if node.op == "Gather" and node.inputs else None
        if not isinstance(data, gs.Constant) or len(data.shape) != 2 or node.attrs.get("axis", 0) != 0:
            continue
        if np.dtype(data.dtype).kind != "f":
            continue
        if data.shape[1] % block:
            reason = f"quantize_embeddings: width {data.shape[1]} is not a multiple of the block size {block}"
            skipped.append(Skipped(node.name, node.op, reason))
            continue
        tables.append(Table(node.name, _tied_heads(graph, np.asarray(data.values))))
    return tables, skipped


def _tied_heads(graph: gs.Graph, table: np.ndarray) -> tuple[str, ...]:
    """MatMul nodes whose constant weight is ``table`` transposed, and Gemm nodes with ``transB=1`` and ``table``."""
    tied = []
    for node in graph.nodes:
        weight = node.inputs[1] if node.op in ("MatMul", "Gemm") and len(node.inputs) > 1 else None
        if not isinstance(weight, gs.Constant):
            continue
        transposed = node.op == "MatMul" or not node.attrs.get("transB", 0)
        expected = table.T if transposed else table
        if tuple(weight.shape) == expected.shape and np.array_equal(np.asarray(weight.values), expected):
            tied.append(node.name)
    return tuple(tied)


def quantize_tables(
    graph: gs.Graph, fmt: BlockFormat, tables: Sequence[Table], values: Mapping[str, np.ndarray], block: int
) -> list[QuantizedOp]:
    """Replace each table (and its tied heads' weights) by the 4-bit table read through DequantizeLinear (see the
    module doc); ``values``: Gather node name -> the float32 table (the float32 graph's, so that a float16 graph is
    quantized from the full-precision values). One QuantizedOp per Gather and per tied head."""
    nodes = {n.name: n for n in graph.nodes}
    done: list[QuantizedOp] = []
    for table in tables:
        gather = nodes.get(table.node)
        if gather is None:
            continue
        constant = gather.inputs[0]
        float_type = np.dtype(constant.dtype)
        matrix = np.asarray(values[table.node], np.float32)
        quantized = quantize(fmt, matrix, fmt.block_size(block), float_type.type)
        base = f"{gather.name}/table_{fmt.name}"
        target = Target(gather.name, "Gather", 1, 0, 0)  # stored as is: [V, D], blocks along D
        out = dequantized_weight(graph, quantized, base, target, float_type, matrix.shape)
        gather.inputs[0] = out
        block_scales = quantized.scales.astype(np.float32) * np.float32(quantized.scale2 or 1.0)
        summary = (int(block_scales.size), float(block_scales.min()), float(block_scales.max()), int(matrix.size))
        done.append(QuantizedOp(gather.name, "Gather", gather.inputs[1].name, 0.0, 0.0, constant.name, *summary))
        readers: dict[tuple[bool, str], gs.Variable] = {}
        for name in table.tied:
            head = nodes[name]
            transposed = not (head.op == "Gemm" and head.attrs.get("transB", 0))
            head_type = np.dtype(head.inputs[1].dtype)  # the float16 graph may keep the Gather's table in float32
            key = (transposed, head_type.name)
            if key not in readers:
                readers[key] = _head_weight(graph, out, base, transposed, float_type, head_type, matrix.shape)
            head.inputs[1] = readers[key]
            done.append(QuantizedOp(name, head.op, head.inputs[0].name, 0.0, 0.0, constant.name, *summary))
    graph.cleanup().toposort()
    return done


def _head_weight(
    graph: gs.Graph,
    table: gs.Variable,
    base: str,
    transposed: bool,
    float_type: np.dtype,
    head_type: np.dtype,
    shape: tuple[int, ...],
) -> gs.Variable:
    """The dequantized table as a tied head reads it: transposed for a MatMul, cast to the head's float type."""
    out = table
    if transposed:
        out = gs.Variable(f"{base}/transposed", dtype=float_type, shape=list(shape[::-1]))
        graph.nodes.append(
            gs.Node("Transpose", f"{base}/Transpose", attrs={"perm": [1, 0]}, inputs=[table], outputs=[out])
        )
    if head_type != float_type:
        cast = gs.Variable(f"{out.name}_{head_type.name}", dtype=head_type, shape=out.shape)
        to = int(onnx.helper.np_dtype_to_tensor_dtype(head_type))
        graph.nodes.append(
            gs.Node("Cast", f"{out.name}/Cast_{head_type.name}", attrs={"to": to}, inputs=[out], outputs=[cast])
        )
        out = cast
    return out
