"""How much of a graph's compute runs in the low type: FLOP-weighted over MatMul, Gemm, Conv and ConvTranspose (the
ops that dominate time on a GPU), with the count of float compute nodes beside it.

Symbolic dimensions count at the size given in ``dims`` (the pipeline passes each dynamic dimension's ``opt``):
the graph's inputs are fixed at those sizes and shapes inferred again, with ONNX's data propagation through
Shape/Gather/Concat/Reshape, so every intermediate gets its size at the opt shape (the exporter's own symbols for
intermediates, ``s0*s1`` and the like, are not in ``dims``). Dimensions still unknown after that count as 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import onnx

from passes.model_io.weightless import light_copy
from passes.precision.types import FOLLOWER_OPS, LowType

FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
HEAVY_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
_NOT_COMPUTE = FOLLOWER_OPS | {"Cast", "Constant", "ConstantOfShape", "Shape", "Size", "IsNaN", "IsInf"}


@dataclass(frozen=True)
class ComputeShare:
    """How much compute runs in the low type: FLOPs of MatMul/Gemm/Conv (or node counts when there are none)."""

    low_flops: float
    total_flops: float
    low_nodes: int
    float_nodes: int
    casts: int
    fp32_flops: Mapping[str, float] = field(default_factory=dict)  # MatMul/Gemm/Conv nodes not in the low type

    @property
    def share(self) -> float:
        """FLOP-weighted share in the low type; the node-count share for a graph without MatMul/Gemm/Conv."""
        if self.total_flops:
            return self.low_flops / self.total_flops
        return self.low_nodes / self.float_nodes if self.float_nodes else 0.0

    @property
    def basis(self) -> str:
        """What the share is measured in."""
        return "MatMul/Gemm/Conv FLOPs" if self.total_flops else "float compute nodes (no MatMul/Gemm/Conv)"


def compute_share(model: onnx.ModelProto, low: LowType, dims: Mapping[str, int] | None = None) -> ComputeShare:
    """The share of ``model``'s MatMul/Gemm/Conv FLOPs in ``low``, with symbolic dims at ``dims`` (their opt sizes)."""
    typed, shape = _shapes(model, dims)
    low_flops = total = 0.0
    low_nodes = float_nodes = casts = 0
    fp32_flops: dict[str, float] = {}
    for node in model.graph.node:
        casts += node.op_type == "Cast"
        out_type = typed[node.output[0]].elem_type if node.output and node.output[0] in typed else 0
        is_low = out_type == low.onnx_type
        if node.op_type in HEAVY_OPS:
            flops = _flops(node, shape)
            total += flops
            low_flops += flops if is_low else 0.0
            if not is_low:
                fp32_flops[node.name] = flops
        if out_type in FLOAT_TYPES and node.op_type not in _NOT_COMPUTE:
            float_nodes += 1
            low_nodes += is_low
    return ComputeShare(low_flops, total, low_nodes, float_nodes, casts, fp32_flops)


def _shapes(
    model: onnx.ModelProto, dims: Mapping[str, int] | None
) -> tuple[dict[str, onnx.TypeProto.Tensor], Callable[[str], list[int] | None]]:
    """Every value's tensor type (initializers included) and a reader of its shape with symbolic dims at ``dims``
    (1 where unknown)."""
    typed = _tensor_types(model, dims or {})
    for tensor in model.graph.initializer:
        typed[tensor.name] = onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims)).tensor_type
    sizes = dict(dims or {})

    def shape(name: str) -> list[int] | None:
        if name not in typed or not typed[name].HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else sizes.get(d.dim_param, 1) for d in typed[name].shape.dim]

    return typed, shape


def _tensor_types(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, onnx.TypeProto.Tensor]:
    """Every value's tensor type, inferred with the graph's inputs fixed at ``dims`` (what inference leaves unknown
    there keeps the type the graph declares). The weights are not read: inference gets the light copy."""
    model = light_copy(model)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    typed = {v.name: v.type.tensor_type for v in [*inferred.input, *inferred.output, *inferred.value_info]}
    if not dims:
        return typed
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    del fixed.graph.value_info[:]  # their symbolic intermediates would win over the sizes propagated from dims
    for value in fixed.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in dims:
                dim.dim_value = int(dims[dim.dim_param])
    at_opt = onnx.shape_inference.infer_shapes(fixed, strict_mode=False, data_prop=True).graph
    typed.update({v.name: v.type.tensor_type for v in [*at_opt.input, *at_opt.output, *at_opt.value_info]})
    return typed


def _flops(node: onnx.NodeProto, shape: Callable[[str], list[int] | None]) -> float:
    out, first = shape(node.output[0]), shape(node.input[0])
    second = shape(node.input[1]) if len(node.input) > 1 else None
    if out is None or first is None or second is None:
        return 0.0
    if node.op_type == "MatMul":
        return 2.0 * math.prod(out) * (first[-1] if first else 1)
    if node.op_type == "Gemm":
        transposed = next((a.i for a in node.attribute if a.name == "transA"), 0)
        return 2.0 * math.prod(out) * (first[0] if transposed else first[-1])
    if node.op_type == "Conv":
        return 2.0 * math.prod(out) * math.prod(second[1:])
    return 2.0 * math.prod(first) * math.prod(second[1:])  # ConvTranspose: every input element, every kernel tap


def node_flops(model: onnx.ModelProto, dims: Mapping[str, int] | None = None) -> dict[int, float]:
    """The FLOPs of each top-level MatMul/Gemm/Conv/ConvTranspose node (by index), with symbolic dims at ``dims``:
    the measure :func:`compute_share` weighs by, for other splits of a graph (TensorRT segments)."""
    _, shape = _shapes(model, dims)
    return {i: _flops(node, shape) for i, node in enumerate(model.graph.node) if node.op_type in HEAVY_OPS}
