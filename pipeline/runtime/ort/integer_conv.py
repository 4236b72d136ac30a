"""INT8 convolutions with a float output on ONNX Runtime's CPU provider: ``DQ -> Conv`` whose output is not
quantized (the convolution before a residual Add, in TensorRT's placement) as an integer matrix product.

ONNX Runtime fuses ``DQ -> Conv -> Q`` into QLinearConv, but a Conv whose output stays float runs in float over the
dequantized input; it has an integer kernel with a float output for matrix products only
(``com.microsoft.MatMulIntegerToFloat``, into which it fuses ``DQ -> MatMul`` itself). So the convolution is written
as one: the 8-bit input, moved to NHWC, gives its patches (``im2col``: a Pad with the zero point, one strided Slice
per kernel tap, a Concat along channels), and ``MatMulIntegerToFloat(patches, W)`` with the weight as a
``(kh*kw*C, K)`` int8 matrix computes ``sum((q_x - z_x) * q_w) * s_x * s_w + b``, then a Transpose back to NCHW.

The value is that of the Q/DQ graph's convolution: the products of 8-bit integers are summed exactly in int32 and
scaled once, as TensorRT's INT8 kernels compute them, where ONNX Runtime's float Conv rounds every product and
partial sum of the dequantized values (the two differ by float32 rounding only; the test holds both to a float64
reference). Taken for a convolution with at least :data:`MIN_CHANNELS` input channels: with fewer, the patches'
Concat copies blocks too small to pay (measured on the bundled CNN, 16 channels at 32x32: slower than the float
NCHWc convolution; 32 and 64 channels: faster).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

#: Fewest input channels for which a float-output convolution becomes an integer matrix product (see the module doc).
MIN_CHANNELS = 32
MICROSOFT_DOMAIN = "com.microsoft"


def integer_float_convs(graph: gs.Graph) -> int:
    """Every ``DQ(uint8) -> Conv(DQ(int8 weight)) -> float`` the module doc describes becomes the im2col and
    ``MatMulIntegerToFloat`` form; the number of convolutions so rewritten. Run after the activations are uint8
    (:func:`pipeline.runtime.ort.int8.switch_to_uint8`)."""
    done = 0
    for conv in [n for n in graph.nodes if n.op == "Conv"]:
        operands = _operands(conv)
        if operands is None:
            continue
        _rewrite(graph, conv, *operands)
        done += 1
    return done


def _operands(conv: gs.Node) -> tuple[gs.Node, gs.Node, tuple[object, int, int, int]] | None:
    """The activation and weight DequantizeLinears and the input shape of a convolution to rewrite, else None."""
    result = conv.outputs[0]
    if len(result.outputs) == 1 and result.outputs[0].op == "QuantizeLinear":
        return None  # ONNX Runtime fuses it into QLinearConv
    attrs = conv.attrs
    if int(attrs.get("group", 1)) != 1 or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return None
    if any(int(d) != 1 for d in attrs.get("dilations", [1, 1])):
        return None
    data, weight = conv.inputs[0], conv.inputs[1]
    if len(data.inputs) != 1 or len(weight.inputs) != 1:
        return None
    activation, weights = data.inputs[0], weight.inputs[0]
    if activation.op != "DequantizeLinear" or weights.op != "DequantizeLinear" or len(activation.inputs) < 3:
        return None
    zero, scale = activation.inputs[2], activation.inputs[1]
    if not (isinstance(zero, gs.Constant) and isinstance(scale, gs.Constant)) or np.asarray(scale.values).size != 1:
        return None
    if np.asarray(scale.values).dtype != np.float32:
        return None  # a float16 graph runs as its float32 emulation, which rounds every half tensor: left as it is
    if np.asarray(zero.values).dtype != np.uint8 or not isinstance(weights.inputs[0], gs.Constant):
        return None
    stored = np.asarray(weights.inputs[0].values)
    if stored.dtype != np.int8 or stored.ndim != 4 or stored.shape[1] < MIN_CHANNELS:
        return None
    if not _symmetric_per_channel(weights, stored.shape[0]):
        return None
    shape = data.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return None  # channels and spatial size fixed (the patches' Slices); the batch may be dynamic
    if len(conv.inputs) > 2 and not isinstance(conv.inputs[2], gs.Constant):
        return None
    return activation, weights, (shape[0], shape[1], shape[2], shape[3])


def _symmetric_per_channel(weights: gs.Node, channels: int) -> bool:
    """Are the weight's scales per output channel (axis 0) or per tensor, and its zero points 0?"""
    scale = weights.inputs[1]
    if not isinstance(scale, gs.Constant) or np.asarray(scale.values).size not in (1, channels):
        return False
    if np.asarray(scale.values).dtype != np.float32:
        return False
    if np.asarray(scale.values).size > 1 and int(weights.attrs.get("axis", 1)) != 0:
        return False
    zero = weights.inputs[2] if len(weights.inputs) > 2 else None
    return zero is None or (isinstance(zero, gs.Constant) and not np.asarray(zero.values).any())


def _rewrite(
    graph: gs.Graph, conv: gs.Node, activation: gs.Node, weights: gs.Node, shape: tuple[object, int, int, int]
) -> None:
    """Replace ``conv`` by im2col, ``MatMulIntegerToFloat`` and a Transpose to NCHW (see the module doc)."""
    stored = np.asarray(weights.inputs[0].values)
    channels_out, channels, kh, kw = stored.shape
    batch, _, height, width = shape
    top, left, bottom, right = [int(p) for p in conv.attrs.get("pads", [0, 0, 0, 0])]
    sy, sx = [int(s) for s in conv.attrs.get("strides", [1, 1])]
    out_h, out_w = (height + top + bottom - kh) // sy + 1, (width + left + right - kw) // sx + 1
    base = f"{conv.name}/integer_conv"
    zero = activation.inputs[2]
    source = _node(graph, "Transpose", f"{base}/to_nhwc", [activation.inputs[0]], np.uint8, perm=[0, 2, 3, 1])
    if top or left or bottom or right:
        pads = np.array([0, top, left, 0, 0, bottom, right, 0], np.int64)
        source = _node(
            graph,
            "Pad",
            f"{base}/pad",
            [source, gs.Constant(f"{base}/pads", pads), _copy(zero, f"{base}/pad_value")],
            np.uint8,
        )  # the zero point dequantizes to 0: Conv's zero padding
    taps = []
    for i in range(kh):
        for j in range(kw):
            starts = np.array([i, j], np.int64)
            ends = np.array([i + (out_h - 1) * sy + 1, j + (out_w - 1) * sx + 1], np.int64)
            inputs = [
                source,
                gs.Constant(f"{base}/starts_{i}_{j}", starts),
                gs.Constant(f"{base}/ends_{i}_{j}", ends),
                gs.Constant(f"{base}/axes_{i}_{j}", np.array([1, 2], np.int64)),
                gs.Constant(f"{base}/steps_{i}_{j}", np.array([sy, sx], np.int64)),
            ]
            taps.append(_node(graph, "Slice", f"{base}/tap_{i}_{j}", inputs, np.uint8))
    patches = taps[0] if len(taps) == 1 else _node(graph, "Concat", f"{base}/patches", taps, np.uint8, axis=3)
    matrix = stored.transpose(2, 3, 1, 0).reshape(kh * kw * channels, channels_out)  # rows in the patches' order
    scales = np.asarray(weights.inputs[1].values, np.float32).reshape(-1)
    bias = np.asarray(conv.inputs[2].values, np.float32) if len(conv.inputs) > 2 else np.zeros(channels_out, np.float32)
    product = _node(
        graph,
        "MatMulIntegerToFloat",
        f"{base}/matmul",
        [
            patches,
            gs.Constant(f"{base}/weight", np.ascontiguousarray(matrix)),
            _copy(activation.inputs[1], f"{base}/input_scale"),
            gs.Constant(f"{base}/weight_scale", np.broadcast_to(scales, (channels_out,)).copy()),
            _copy(zero, f"{base}/input_zero_point"),
            gs.Constant(f"{base}/weight_zero_point", np.zeros(channels_out, np.int8)),
            gs.Constant(f"{base}/bias", bias),
        ],
        np.float32,
        domain=MICROSOFT_DOMAIN,
    )
    product.shape = [batch, out_h, out_w, channels_out]
    result = conv.outputs[0]
    conv.outputs.clear()
    graph.nodes.append(
        gs.Node("Transpose", f"{base}/to_nchw", attrs={"perm": [0, 3, 1, 2]}, inputs=[product], outputs=[result])
    )


def _node(
    graph: gs.Graph,
    op: str,
    name: str,
    inputs: list[gs.Tensor],
    dtype: type,
    domain: str | None = None,
    **attrs: object,
) -> gs.Variable:
    """Append one node with one output of ``dtype``; its output."""
    output = gs.Variable(f"{name}/output", dtype=dtype)
    graph.nodes.append(gs.Node(op, name, attrs=dict(attrs), inputs=inputs, outputs=[output], domain=domain))
    return output


def _copy(constant: gs.Constant, name: str) -> gs.Constant:
    """A new constant with the values of ``constant`` (:func:`_operands` checked that it is one)."""
    return gs.Constant(name, np.array(constant.values))
