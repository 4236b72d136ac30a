"""Sibling projections as one MatMul: ``x @ Wq``, ``x @ Wk``, ``x @ Wv`` (and a gated MLP's ``x @ Wgate``,
``x @ Wup``) become ``Split(x @ Concat(Wq, Wk, Wv))``.

A decoder layer reads its normalised hidden state three times for attention and twice for a gated MLP, each a MatMul
with its own weight. One MatMul over the concatenated weights reads ``x`` once, makes one kernel call instead of
three, and gives the GEMM a wider N (ONNX Runtime GenAI's builder writes the fused form too). The pass is generic:
any tensor read as the left operand of two or more MatMuls whose right operands are constant 2-D weights of the same
dtype and the same K. The ``Split`` outputs keep the original MatMuls' output tensors (names included), so whatever
read them reads them still; only the weights' layout changes. The two new nodes carry no PyTorch module path (they
belong to all the projections at once), so a per-layer comparison no longer matches the projection modules
themselves; it compares their parent (the attention block) as before.

Weights held outside the graph (``external_data_threshold``: a model too large to hold in memory) are left alone, so
that the pass never loads them; so are quantized weights (a MatMul whose right operand is a ``DequantizeLinear``):
the quantization stage quantizes the merged weight like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from converters.settings import Settings
from passes.base import STANDARD_DOMAINS, PassResult
from passes.cleanup.graph import remove_unused
from passes.model_io.external_data import constant_values


class MergeSiblingMatMuls:
    """Merge the MatMuls that share their left operand and have constant 2-D weights (module docstring)."""

    name = "merge_sibling_matmuls"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        merged = 0
        for tensor in list(graph.tensors().values()):
            for group in _groups(tensor):
                _merge(graph, tensor, group, merged)
                merged += 1
        if merged:
            remove_unused(graph)
        return PassResult(graph, merged > 0, settled=True)


def _weight(node: gs.Node) -> gs.Constant | None:
    weight = node.inputs[1] if len(node.inputs) == 2 else None
    if not isinstance(weight, gs.Constant) or _external(weight):
        return None
    shape = weight.shape
    return weight if shape is not None and len(shape) == 2 else None


def _external(constant: gs.Constant) -> bool:
    """Are the constant's values in an external data file (not read into memory)?"""
    raw = constant._values
    return isinstance(raw, LazyValues) and raw.tensor.data_location == onnx.TensorProto.EXTERNAL


def _groups(tensor: gs.Tensor) -> list[list[gs.Node]]:
    """The MatMuls reading ``tensor`` as their left operand, grouped by weight dtype and K (groups of two or more)."""
    by_key: dict[tuple[object, int], list[gs.Node]] = {}
    for node in tensor.outputs:
        if node.op != "MatMul" or node.domain not in STANDARD_DOMAINS or node.inputs[0] is not tensor:
            continue
        weight = _weight(node)
        if weight is None or node.inputs[1] is tensor or len(node.outputs) != 1:
            continue
        by_key.setdefault((np.dtype(weight.dtype), int(weight.shape[0])), []).append(node)
    return [sorted(group, key=lambda n: n.name) for group in by_key.values() if len(group) >= 2]


def _merge(graph: gs.Graph, tensor: gs.Tensor, group: Sequence[gs.Node], index: int) -> None:
    weights = [constant_values(node.inputs[1]) for node in group]
    # a name of its own, not under one projection's node name: node metadata is restored by name prefix
    # (passes.model_io.graphs.to_model), and the merged node belongs to none of the projections' modules
    base = f"merged_matmul{index}.{group[0].name or 'matmul'}"
    merged = gs.Constant(f"{base}/weight", np.ascontiguousarray(np.concatenate(weights, axis=1)))
    product = gs.Variable(f"{base}/product", dtype=group[0].outputs[0].dtype)
    sizes = gs.Constant(f"{base}/sizes", np.array([w.shape[1] for w in weights], np.int64))
    outputs = [node.outputs[0] for node in group]
    for node in group:
        node.outputs.clear()
        node.inputs.clear()
    graph.nodes.append(gs.Node("MatMul", name=f"{base}/matmul", inputs=[tensor, merged], outputs=[product]))
    graph.nodes.append(
        gs.Node("Split", name=f"{base}/split", inputs=[product, sizes], outputs=outputs, attrs={"axis": -1})
    )
