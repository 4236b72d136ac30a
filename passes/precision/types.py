"""Type facts the precision pass decides with: the low-precision targets, which ops TensorRT's ONNX parser takes in
which half type, which ops the ONNX schema lets take it, and the dtype of every tensor of a graph.

The TensorRT table is the parser's operator matrix (TensorRT 11.1, ``pipeline/compatibility/data/trt_onnx_ops.csv``)
reduced to what this pass needs; ``tests/passes/test_precision_types.py`` keeps the two in sync. It is written out here
because passes may not import ``pipeline``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs

logger = logging.getLogger(__name__)

FLOAT = onnx.TensorProto.FLOAT


@dataclass(frozen=True)
class LowType:
    """A low-precision target: its names, ONNX and numpy types, and the largest finite value it holds."""

    name: str  # "fp16"
    dtype_name: str  # "float16": the name tolerances and reports use
    onnx_type: int
    numpy_type: type
    max_finite: float
    trt_token: str  # "FP16": the name in TensorRT's operator matrix

    @property
    def gs_dtype(self) -> object:
        """What graph-surgeon variables carry as dtype (it has no numpy type for bfloat16)."""
        return np.float16 if self.onnx_type == onnx.TensorProto.FLOAT16 else self.onnx_type


LOW_TYPES: Mapping[str, LowType] = {
    "fp16": LowType("fp16", "float16", onnx.TensorProto.FLOAT16, np.float16, 65504.0, "FP16"),
    "bf16": LowType(
        "bf16",
        "bfloat16",
        onnx.TensorProto.BFLOAT16,
        ml_dtypes.bfloat16,
        float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
        "BF16",
    ),
}

#: Every op TensorRT 11.1's ONNX parser supports with at least one float type.
_TRT_FLOAT_OPS = """
    Abs Acos Acosh Add ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool BatchNormalization
    BlackmanWindow Cast CastLike Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh
    CumSum DeformConv DepthToSpace Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor GRU Gather
    GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual
    GridSample GroupNormalization HammingWindow HannWindow HardSigmoid HardSwish Hardmax Identity If ImageScaler
    InstanceNormalization IsInf IsNaN LRN LSTM LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop
    LpNormalization LpPool MatMul Max MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg
    NonMaxSuppression NonZero OneHot PRelu Pad ParametricSoftplus Pow QuantizeLinear RMSNormalization RNN
    RandomNormal RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2
    ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu
    Reshape Resize ReverseSequence RoiAlign RotaryEmbedding Round STFT ScaledTanh Scan Scatter ScatterElements
    ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax Softplus Softsign SpaceToDepth Split
    Sqrt Squeeze Sub Sum Swish Tan Tanh TensorScatter ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze
    Upsample Where
"""
TRT_FLOAT_OPS = frozenset(_TRT_FLOAT_OPS.split())
#: Of those, the ops whose type list lacks FP16, and those whose type list lacks BF16.
TRT_NO_FP16 = frozenset({"STFT"})
TRT_NO_BF16 = frozenset(
    {
        "BlackmanWindow",
        "DeformConv",
        "GridSample",
        "HammingWindow",
        "HannWindow",
        "Mish",
        "NonMaxSuppression",
        "NonZero",
        "RoiAlign",
        "STFT",
    }
)

#: Ops that only move, select or copy elements: exact in any type, so they take the precision of their data input
#: (which keeps casts at island boundaries instead of around every Reshape).
_FOLLOWER_OPS = """
    Reshape Transpose Squeeze Unsqueeze Flatten Identity Gather GatherElements GatherND Slice Split Concat
    Expand Tile DepthToSpace SpaceToDepth Dropout Where ReverseSequence Trilu Pad Max Min GlobalMaxPool MaxPool
    ReduceMax ReduceMin
"""
FOLLOWER_OPS = frozenset(_FOLLOWER_OPS.split())


def is_standard(node: gs.Node) -> bool:
    """Is the node in the standard ONNX domain?"""
    return node.domain in ("", None, "ai.onnx")


def trt_accepts(op: str, low: LowType) -> str | None:
    """None when TensorRT's parser takes ``op`` in ``low``; otherwise why not."""
    if op not in TRT_FLOAT_OPS:
        return f"TensorRT's ONNX parser has no float {op}, so its types are unknown"
    if (low.name == "fp16" and op in TRT_NO_FP16) or (low.name == "bf16" and op in TRT_NO_BF16):
        return f"TensorRT's ONNX parser does not take {op} in {low.trt_token}"
    return None


@functools.cache
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def float_slots(op: str, opset: int, low: LowType) -> tuple[frozenset[int], frozenset[int]] | str:
    """Input and output positions that may carry ``low`` instead of float32 under the ONNX schema of ``opset``.

    A position typed ``tensor(float)`` by name, or by a type variable that does not allow ``low``, must stay
    float32. Returns the reason as a string when the op has no schema at that opset.
    """
    schema = _schema(op, opset)
    if schema is None:
        return f"ONNX opset {opset} has no {op}"
    wanted = f"tensor({low.dtype_name})"
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def slots(params: Sequence[onnx.defs.OpSchema.FormalParameter], count: int) -> frozenset[int]:
        out = set()
        for index in range(count):
            param = params[min(index, len(params) - 1)] if params else None
            if param is not None and wanted in allowed.get(param.type_str, {param.type_str}):
                out.add(index)
        return frozenset(out)

    return slots(schema.inputs, 64), slots(schema.outputs, 64)


def onnx_opset(graph: gs.Graph) -> int:
    """The graph's default-domain opset."""
    return int(graph.opset or 1)


def dtype_of(tensor: gs.Tensor, inferred: Inferred) -> int | None:
    """The ONNX element type of a graph-surgeon tensor: its own dtype, else ONNX shape inference's."""
    if tensor.dtype is not None:  # a Constant's dtype is its values' (read lazily, without loading them)
        return _onnx_type(tensor.dtype)
    return inferred.types.get(tensor.name)


def _onnx_type(dtype: Any) -> int | None:
    if isinstance(dtype, int):
        return dtype
    try:
        if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
            return onnx.TensorProto.BFLOAT16
        return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (TypeError, KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Inferred:
    """What ONNX shape inference says about every tensor it can type (graph-surgeon keeps only what value_info had).

    Shapes hold ints for known dims and strings for symbolic ones (None when even that is unknown)."""

    types: Mapping[str, int]
    shapes: Mapping[str, tuple[int | str | None, ...]]


def infer(graph: gs.Graph) -> Inferred:
    """Element types and shapes of every tensor, from ONNX shape inference on the graph as it is now."""
    model = gs.export_onnx(graph, do_type_check=False)
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # an op inference does not know: keep what the graph already says, and say so
        logger.warning(
            "precision: shape inference failed (%s); tensors without a declared type are left in float32", exc
        )
    infos = [*model.graph.value_info, *model.graph.input, *model.graph.output]
    types = {v.name: v.type.tensor_type.elem_type for v in infos if v.type.tensor_type.elem_type}
    shapes = {v.name: _dims(v.type.tensor_type) for v in infos if v.type.tensor_type.HasField("shape")}
    return Inferred(types, shapes)


def _dims(tensor_type: onnx.TypeProto.Tensor) -> tuple[int | str | None, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim)


def shape_of(tensor: gs.Tensor, inferred: Inferred) -> tuple[int | str | None, ...] | None:
    """The tensor's shape: its own, else the inferred one, else None."""
    if tensor.shape is not None:
        return tuple(tensor.shape)
    return inferred.shapes.get(tensor.name)


def is_float32(tensor: gs.Tensor, inferred: Inferred) -> bool:
    """Is the tensor float32 (by its own or its inferred type)?"""
    return dtype_of(tensor, inferred) == FLOAT
