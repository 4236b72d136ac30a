"""The Q/DQ rewrite: per-channel quantized weights (8-bit initializer -> DequantizeLinear) and per-tensor activation
Q -> DQ pairs at the inputs of the planned weighted ops (:mod:`passes.quantize.placement`) and at the residual
inputs of Adds after them (:mod:`passes.quantize.residual`).

Every quantized input gets its own QuantizeLinear -> DequantizeLinear pair, with its own scale and zero-point
initializers (equal values for one tensor): TensorRT merges equal pairs itself (its builder's "dupe layer removal"),
and ONNX Runtime needs them apart. Its CPU provider fuses ``DQ -> Conv -> Q`` into QLinearConv only for uint8
activations on x86 (``QDQIsInt8Allowed()`` is false there, ``qdq_selector_action_transformer.h``), and it turns an
int8 pair into uint8 only when the QuantizeLinear has exactly one consumer (``QDQS8ToU8Transformer``,
``qdq_s8_to_u8.cc``); shared scale initializers would let its common-subexpression elimination merge the pairs back.

Scales take the float type of the tensor they scale (float16 in a graph whose unquantized ops run in float16, else
float32): QuantizeLinear and DequantizeLinear take float16 scales from opset 19, and the DequantizeLinear output
then has the type the weighted op already reads, so no Cast is needed around the pair.

>>> ops = quantize_graph(graph, FORMATS["int8"], targets, {"conv1": 2.5})   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from converters.errors import ConversionError
from passes.precision.types import infer
from passes.quantize.formats import QUANTIZED_OPS, QuantFormat
from passes.quantize.placement import Target
from passes.records import QuantizedOp

_FLOAT_TYPES: dict[int, type] = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16}


def quantize_graph(
    graph: gs.Graph,
    fmt: QuantFormat,
    targets: Sequence[Target],
    amax: Mapping[str, float],
    relu_inputs: bool = True,
) -> list[QuantizedOp]:
    """Insert the Q/DQ pairs and quantized weights for ``targets`` (``amax``: node name -> calibrated range of its
    activation input; a target without a weight, such as a residual Add, gets only its activation pair). INT8 graphs
    then get the exact output quantization of :func:`quantize_relu_inputs` (``relu_inputs=False``: not, so that
    each rounding stays at the input of the op it belongs to, as the sensitivity ranking needs). Raises
    :class:`ConversionError` when the graph's opset predates ``fmt``'s Q/DQ."""
    opset = int(graph.opset or 1)
    if opset < fmt.min_opset:
        raise ConversionError(
            f"stage quantize: {fmt.name} QuantizeLinear/DequantizeLinear need ONNX opset >= {fmt.min_opset}, the "
            f"graph has opset {opset}",
            fix=f"export with opset >= {fmt.min_opset} (leave opset=None: {fmt.name} exports at opset 21)",
        )
    types = infer(graph).types
    nodes = {n.name: n for n in graph.nodes}
    readers: dict[str, int] = {}  # activation name -> pairs made so far (each reader gets its own)
    weights: dict[str, tuple[gs.Variable, np.ndarray]] = {}  # weight name -> (its DQ output, scales)
    done = []
    for target in targets:
        node = nodes[target.node]
        if target.node not in amax:
            raise ConversionError(
                f"stage quantize: node {target.node!r} ({target.op}) has no calibrated range",
                fix="calibrate on the graph being quantized (the node names must match)",
            )
        source = node.inputs[target.activation]
        copy = readers.get(source.name, 0)
        readers[source.name] = copy + 1
        restored, scale = activation_pair(graph, source, fmt, amax[target.node], _float_type(source, types), copy)
        node.inputs[target.activation] = restored
        weight = node.inputs[target.weight] if target.weight is not None else None
        scales = np.ones(0, np.float32)
        if isinstance(weight, gs.Constant):
            if weight.name not in weights:
                weights[weight.name] = _weight_pair(graph, weight, fmt, target.axis)
            node.inputs[target.weight] = weights[weight.name][0]
            scales = weights[weight.name][1].astype(np.float32)
        done.append(
            QuantizedOp(
                target.node,
                target.op,
                source.name,
                float(amax[target.node]),
                scale,
                weight.name if weight is not None else None,
                int(scales.size),
                float(scales.min()) if scales.size else 0.0,
                float(scales.max()) if scales.size else 0.0,
                int(np.prod(weight.shape)) if weight is not None else 0,
            )
        )
    if fmt.name == "int8" and relu_inputs:
        quantize_relu_inputs(graph)
    graph.cleanup().toposort()
    return done


def quantize_relu_inputs(graph: gs.Graph) -> int:
    """``Conv -> Relu -> Q(s)`` becomes ``Conv -> Q(s) -> DQ -> Relu -> Q(s)`` where that changes no value; the
    number of Relus so treated.

    Exact: with zero point 0, ``Q(Relu(x)) == Relu(Q(x))`` (quantization is monotonic and maps 0 to 0), and
    ``Q(DQ(q)) == q``; so when every reader of the Relu's output quantizes it with one scale ``s``, the Conv's output
    may be quantized with ``s`` first. TensorRT fuses a weighted op whose inputs and output are quantized into one
    8-bit-in, 8-bit-out kernel ("Q/DQ Layer-Placement Recommendations", the convolution fusion with quantized inputs
    and output), and its advice to keep weighted outputs unquantized by default is about precision, which this
    form keeps bit for bit. ONNX Runtime's CPU provider needs it: it fuses ``DQ -> Conv -> Q`` into QLinearConv,
    and a Relu between the Conv and the Q blocks that unless the zero point is the type's minimum
    (``IsClipMadeRedundantByQ``), never the case for TensorRT's symmetric quantization. Applies to Conv,
    ConvTranspose, MatMul and Gemm whose activation input is already dequantized (a quantized op) and whose only
    reader is the Relu."""
    done = 0
    for relu in [n for n in graph.nodes if n.op == "Relu"]:
        tensor = relu.inputs[0]
        if len(tensor.inputs) != 1 or len(tensor.outputs) != 1:
            continue
        producer = tensor.inputs[0]
        if producer.op not in QUANTIZED_OPS or not _reads_dequantized(producer):
            continue
        scale = _common_scale(relu.outputs[0])
        if scale is None:
            continue
        restored = _pair(graph, tensor, scale, f"{tensor.name}/relu_input")
        relu.inputs[0] = restored
        done += 1
    return done


def _reads_dequantized(node: gs.Node) -> bool:
    data = node.inputs[0]
    return bool(data.inputs) and data.inputs[0].op == "DequantizeLinear"


def _common_scale(tensor: gs.Tensor) -> gs.Constant | None:
    """The scale every reader of ``tensor`` quantizes it with (per tensor, zero point 0), or None."""
    readers = list(tensor.outputs)
    if not readers or any(r.op != "QuantizeLinear" or len(r.inputs) < 3 for r in readers):
        return None
    scales = [r.inputs[1] for r in readers]
    zeros = [r.inputs[2] for r in readers]
    if not all(isinstance(c, gs.Constant) and np.asarray(c.values).size == 1 for c in scales + zeros):
        return None
    first = np.asarray(scales[0].values)
    same = all(np.array_equal(np.asarray(c.values), first) for c in scales)
    zero = all(not np.asarray(z.values).astype(np.float32).any() for z in zeros)
    return scales[0] if same and zero else None


def _pair(graph: gs.Graph, source: gs.Tensor, like: gs.Constant, base: str) -> gs.Variable:
    """``source -> Q -> DQ`` with a copy of the scale ``like`` (and its zero point's type)."""
    reader = next(r for r in like.outputs if r.op == "QuantizeLinear")
    zero_values = np.asarray(reader.inputs[2].values)
    scale_c = gs.Constant(f"{base}/quant_scale", np.array(like.values))
    zero = gs.Constant(f"{base}/quant_zero_point", np.zeros_like(zero_values))
    quantized = gs.Variable(f"{base}/quantized", dtype=zero_values.dtype, shape=source.shape)
    restored = gs.Variable(f"{base}/dequantized", dtype=np.asarray(like.values).dtype, shape=source.shape)
    graph.nodes.append(
        gs.Node("QuantizeLinear", f"{base}/QuantizeLinear", inputs=[source, scale_c, zero], outputs=[quantized])
    )
    graph.nodes.append(
        gs.Node("DequantizeLinear", f"{base}/DequantizeLinear", inputs=[quantized, scale_c, zero], outputs=[restored])
    )
    return restored


def _float_type(tensor: gs.Tensor, types: Mapping[str, int]) -> type:
    elem = (
        types.get(tensor.name)
        if tensor.dtype is None
        else int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(tensor.dtype)))
    )
    if elem is None or elem not in _FLOAT_TYPES:
        raise ConversionError(
            f"stage quantize: tensor {tensor.name!r} is {onnx.TensorProto.DataType.Name(elem or 0)}, not float32 "
            "or float16",
            fix="quantize a float32 or float16 graph (precision fallback 'fp16' or 'fp32'); add its consumer to "
            "keep_fp32 to leave it unquantized",
        )
    return _FLOAT_TYPES[elem]


def activation_pair(
    graph: gs.Graph, source: gs.Tensor, fmt: QuantFormat, amax: float, float_type: type, copy: int = 0
) -> tuple[gs.Variable, float]:
    """``source -> QuantizeLinear -> DequantizeLinear`` for one reader: one scale for the tensor (per-tensor
    activations); ``copy`` numbers the pairs of one tensor (each with its own initializers, see the module doc)."""
    wanted: np.ndarray = np.asarray(fmt.scale_for(amax), dtype=float_type)
    scale: np.ndarray = np.asarray(
        max(wanted, np.finfo(float_type).tiny), dtype=float_type
    )  # a scale rounded to 0 divides by 0
    base = source.name if copy == 0 else f"{source.name}/{copy}"
    scale_c = gs.Constant(f"{base}/quant_scale", scale)
    zero = gs.Constant(f"{base}/quant_zero_point", fmt.zero_point())
    quantized = gs.Variable(f"{base}/quantized", dtype=fmt.numpy_type, shape=source.shape)
    restored = gs.Variable(f"{base}/dequantized", dtype=float_type, shape=source.shape)
    graph.nodes.append(
        gs.Node("QuantizeLinear", f"{base}/QuantizeLinear", inputs=[source, scale_c, zero], outputs=[quantized])
    )
    graph.nodes.append(
        gs.Node("DequantizeLinear", f"{base}/DequantizeLinear", inputs=[quantized, scale_c, zero], outputs=[restored])
    )
    return restored, float(scale)


def _weight_pair(
    graph: gs.Graph, weight: gs.Constant, fmt: QuantFormat, axis: int | None
) -> tuple[gs.Variable, np.ndarray]:
    """The weight stored quantized, then ``DequantizeLinear`` (per channel along ``axis``, else per tensor)."""
    values = np.asarray(weight.values)
    float_type = _FLOAT_TYPES.get(onnx.helper.np_dtype_to_tensor_dtype(values.dtype), np.float32)
    wide = values.astype(np.float32)
    if axis is None:
        amax = np.abs(wide).max(initial=0.0)
        scales: np.ndarray = np.asarray(fmt.scale_for(amax)).astype(float_type)
        broadcast = scales.astype(np.float32)
    else:
        others = tuple(i for i in range(wide.ndim) if i != axis)
        amax = np.abs(wide).max(axis=others, initial=0.0)
        scales = fmt.scale_for(amax).astype(float_type)
        scales = np.where(scales > 0, scales, np.ones_like(scales))  # a scale that underflows the type: harmless 1
        shape = [1] * wide.ndim
        shape[axis] = -1
        broadcast = scales.astype(np.float32).reshape(shape)
    stored = fmt.quantize(wide, broadcast)  # with the scale as the graph holds it: DQ(stored) is exact
    base = weight.name
    q = gs.Constant(f"{base}/quantized_{fmt.name}", stored)
    scale_c = gs.Constant(f"{base}/weight_scale", scales)
    zero = gs.Constant(f"{base}/weight_zero_point", fmt.zero_point(scales.shape))
    restored = gs.Variable(f"{base}/dequantized", dtype=float_type, shape=list(values.shape))
    attrs = {} if axis is None else {"axis": axis}
    graph.nodes.append(
        gs.Node(
            "DequantizeLinear", f"{base}/DequantizeLinear", attrs=attrs, inputs=[q, scale_c, zero], outputs=[restored]
        )
    )
    return restored, np.atleast_1d(scales)
