"""The 4-bit weight-only rewrite: each planned MatMul/Gemm reads its constant weight through ``DequantizeLinear`` of
a block-quantized INT4 or NVFP4 initializer (:mod:`passes.quantize.blockwise`); activations stay in the graph's
float type (W4A16). The graph forms are the ones TensorRT-RTX's parser and builder were measured to take
(``LLM_ON_TENSORRT.md``, "Weight-only and low-bit formats"):

* INT4, MatMul weight ``[K, N]``: ``DequantizeLinear(int4 [K, N], scale [K / B, N], axis=0, block_size=B) ->
  MatMul`` (scales in the graph's float type, no zero point); a Gemm's ``[N, K]`` weight (``transB=1``) blocks along
  axis 1.
* NVFP4, as ModelOpt writes it: ``DequantizeLinear(fp8 block scales [N, K / 16], float32 scale2) ->
  DequantizeLinear(fp4 [N, K], that, axis=-1, block_size=16) -> Transpose (for a [K, N] weight) -> Cast (to a
  float16 graph's type) -> MatMul``.

Activation-aware scales (AWQ, :mod:`pipeline.quantize.awq`) come in as one vector ``s`` per activation tensor: the
weight quantized is ``diag(s) W`` and the activation is multiplied by ``1 / s`` first (one ``Mul`` shared by every
MatMul that reads the tensor), which leaves the float product unchanged.

>>> done = quantize_weights(graph, BLOCK_FORMATS["int4"], targets, weights, 128)   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper
from onnx_graphsurgeon.ir.tensor import LazyValues

from converters.errors import ConversionError
from passes.quantize.blockwise import BlockFormat, BlockQuantized, quantize
from passes.quantize.placement import Target
from passes.records import QuantizedOp, Skipped


def weight_matrix(target: Target, weight: np.ndarray) -> np.ndarray:
    """The constant weight of ``target`` as ``[N, K]`` (output channels, input channels), float32."""
    wide = np.asarray(weight, np.float32)
    return wide if target.axis == 0 else wide.T


def blockable(targets: Sequence[Target], graph: gs.Graph, block: int) -> tuple[list[Target], list[Skipped]]:
    """The targets whose weight is a 2-D constant with input channels a multiple of ``block``, and the others."""
    nodes = {n.name: n for n in graph.nodes}
    kept: list[Target] = []
    skipped: list[Skipped] = []
    for target in targets:
        weight = nodes[target.node].inputs[target.weight] if target.weight is not None else None
        shape = tuple(weight.shape) if isinstance(weight, gs.Constant) else ()
        if target.op not in ("MatMul", "Gemm") or len(shape) != 2 or target.axis is None:
            skipped.append(Skipped(target.node, target.op, "4-bit weights: MatMul/Gemm with a 2-D constant only"))
            continue
        columns = shape[1] if target.axis == 0 else shape[0]
        if columns % block:
            reason = f"4-bit weights: {columns} input channels are not a multiple of the block size {block}"
            skipped.append(Skipped(target.node, target.op, reason))
            continue
        kept.append(target)
    return kept, skipped


def quantize_weights(
    graph: gs.Graph,
    fmt: BlockFormat,
    targets: Sequence[Target],
    weights: Mapping[str, np.ndarray],
    block: int,
    input_scales: Mapping[str, np.ndarray] | None = None,
) -> list[QuantizedOp]:
    """Replace each target's constant weight by its 4-bit form (see the module doc). ``weights``: node name -> the
    float32 weight in the node's own layout (the float32 graph's, so that a float16 graph is quantized from the
    full-precision values); ``input_scales``: node name -> AWQ's per-input-channel ``s`` (optional)."""
    opset = int(graph.opset or 1)
    if opset < fmt.min_opset:
        raise ConversionError(
            f"stage quantize: {fmt.name} DequantizeLinear needs ONNX opset >= {fmt.min_opset}, the graph has {opset}",
            fix=f"export with opset >= {fmt.min_opset} (leave opset=None: {fmt.name} exports at it)",
        )
    nodes = {n.name: n for n in graph.nodes}
    scaled_inputs: dict[str, gs.Variable] = {}
    done = []
    for target in targets:
        node = nodes[target.node]
        assert target.weight is not None
        constant = node.inputs[target.weight]
        float_type = np.dtype(constant.dtype) if constant.dtype is not None else np.dtype(np.float32)
        matrix = weight_matrix(target, weights[target.node])
        scales = (input_scales or {}).get(target.node)
        activation = node.inputs[target.activation]
        if scales is not None:
            matrix = matrix * scales[None, :].astype(np.float32)
            if activation.name not in scaled_inputs:
                scaled_inputs[activation.name] = _scaled_input(graph, activation, scales, float_type)
            node.inputs[target.activation] = scaled_inputs[activation.name]
        quantized = quantize(fmt, matrix, fmt.block_size(block), float_type.type)
        base = f"{node.name}/weight_{fmt.name}"
        node.inputs[target.weight] = dequantized_weight(graph, quantized, base, target, float_type, matrix.shape)
        block_scales = quantized.scales.astype(np.float32) * np.float32(quantized.scale2 or 1.0)
        done.append(
            QuantizedOp(
                target.node,
                target.op,
                activation.name,
                0.0,
                0.0,
                constant.name,
                int(block_scales.size),
                float(block_scales.min()),
                float(block_scales.max()),
                int(matrix.size),
            )
        )
    graph.cleanup().toposort()
    return done


def _packed(name: str, values: np.ndarray) -> gs.Constant:
    """A 4-bit constant as ONNX stores it (two values per byte): graph-surgeon's own export writes one per byte."""
    return gs.Constant(name, LazyValues(numpy_helper.from_array(np.ascontiguousarray(values), name)))


def _scaled_input(graph: gs.Graph, source: gs.Tensor, scales: np.ndarray, float_type: np.dtype) -> gs.Variable:
    """``source * (1 / s)``: the activation AWQ's scaled weight expects."""
    inverse = gs.Constant(f"{source.name}/awq_inverse_scale", (1.0 / scales.astype(np.float64)).astype(float_type))
    out = gs.Variable(f"{source.name}/awq_scaled", dtype=float_type, shape=source.shape)
    graph.nodes.append(gs.Node("Mul", f"{source.name}/awq_Mul", inputs=[source, inverse], outputs=[out]))
    return out


def dequantized_weight(
    graph: gs.Graph,
    quantized: BlockQuantized,
    base: str,
    target: Target,
    float_type: np.dtype,
    shape: tuple[int, ...],
) -> gs.Variable:
    """The DequantizeLinear chain that gives the weight back in the node's layout and the graph's float type."""
    rows, columns = shape  # [N, K]
    if quantized.scale2 is None:  # INT4: stored in the node's own layout, blocks along its K axis
        transposed = target.axis != 0
        values = quantized.values.T if transposed else quantized.values
        scales = quantized.scales.T if transposed else quantized.scales
        out = gs.Variable(f"{base}/dequantized", dtype=float_type, shape=list(values.shape))
        graph.nodes.append(
            gs.Node(
                "DequantizeLinear",
                f"{base}/DequantizeLinear",
                attrs={"axis": 0 if transposed else 1, "block_size": quantized.block},
                inputs=[
                    _packed(f"{base}/quantized", values),
                    gs.Constant(f"{base}/scale", np.ascontiguousarray(scales)),
                ],
                outputs=[out],
            )
        )
        return out
    block_scales = gs.Variable(f"{base}/block_scales", dtype=np.float32, shape=list(quantized.scales.shape))
    graph.nodes.append(
        gs.Node(
            "DequantizeLinear",
            f"{base}/scale_DequantizeLinear",
            inputs=[
                gs.Constant(f"{base}/block_scales_fp8", quantized.scales),
                gs.Constant(f"{base}/scale2", np.asarray(quantized.scale2, np.float32)),
            ],
            outputs=[block_scales],
        )
    )
    out = gs.Variable(f"{base}/dequantized_nk", dtype=np.float32, shape=[rows, columns])
    graph.nodes.append(
        gs.Node(
            "DequantizeLinear",
            f"{base}/DequantizeLinear",
            attrs={"axis": -1, "block_size": quantized.block},
            inputs=[_packed(f"{base}/quantized", quantized.values), block_scales],
            outputs=[out],
        )
    )
    if target.axis != 0:
        transposed = gs.Variable(f"{base}/dequantized_kn", dtype=np.float32, shape=[columns, rows])
        graph.nodes.append(
            gs.Node("Transpose", f"{base}/Transpose", attrs={"perm": [1, 0]}, inputs=[out], outputs=[transposed])
        )
        out = transposed
    if float_type != np.float32:
        cast = gs.Variable(f"{base}/dequantized_{float_type.name}", dtype=float_type, shape=list(out.shape))
        to = int(onnx.helper.np_dtype_to_tensor_dtype(float_type))
        graph.nodes.append(gs.Node("Cast", f"{base}/Cast", attrs={"to": to}, inputs=[out], outputs=[cast]))
        out = cast
    return out
