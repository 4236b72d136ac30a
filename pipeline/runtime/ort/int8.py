"""The INT8 graph as ONNX Runtime's CPU provider runs it fastest: rewrites of the session's graph only
(``module.onnx`` keeps TensorRT's Q/DQ placement, bit for bit).

Rewrites 1 to 5 hold under ONNX's definitions of QuantizeLinear (``Q``: ``saturate(round_half_even(x / s) + z)``)
and DequantizeLinear (``DQ``: ``(q - z) * s``) for every input, bit for bit (the tests run both graphs on ONNX
Runtime's reference kernels). Rewrites 6 and 7 are what an integer kernel needs, and change float32 rounding only:

1. **Quantized outputs through monotonic ops** (:func:`quantize_weighted_outputs`). ``W -> Relu/MaxPool ... -> Q(s)``
   (every reader of the chain's end quantizing with one per-tensor scale ``s``, zero point 0) becomes ``W -> Q(s) ->
   DQ -> Relu -> Q(s) -> DQ -> MaxPool -> Q(s)``: ``Q`` is monotonic and maps 0 to 0, so ``Q(Relu(x)) ==
   Relu(Q(x))`` and ``Q(MaxPool(x)) == MaxPool(Q(x))``, and ``Q(DQ(q)) == q``. The weighted op ``W`` then has
   ``DQ -> W -> Q`` around it, which ONNX Runtime fuses into QLinearConv (``NodeGroupSelector::CheckQDQNodes``).
   The graph for TensorRT already has this form for a single Relu (:func:`passes.quantize.insert.
   quantize_relu_inputs`); the stem of a ResNet (``Conv -> Relu -> MaxPool``) needs the longer chain.
2. **uint8 activations** (:func:`switch_to_uint8`). An activation pair ``Q(s, 0) -> DQ(s, 0)`` in int8 becomes
   ``Q(s, 128) -> DQ(s, 128)`` in uint8: the same grid, rounding and saturation, every value shifted by 128.
   ONNX Runtime's x86 integer kernels take uint8 activations and int8 weights (U8S8, ``QDQIsInt8Allowed()`` is
   false there); its own ``QDQS8ToU8Transformer`` does this only for a QuantizeLinear with one reader, before
   rewrite 3, so it is done here for every pair.
3. **Integer Relu and MaxPool** (:func:`integer_relu_and_pool`). ``DQ(s, z) -> Relu -> Q(s, z)`` is ``Max(q, z)``
   and ``DQ(s, z) -> MaxPool -> Q(s, z)`` is ``MaxPool(q)`` on the 8-bit tensor, by the same monotonicity: no
   float round trip (three passes over the tensor) remains between two integer kernels.
4. **One QuantizeLinear per tensor and scale** (:func:`share_quantize`): TensorRT's graph gives each reader its own
   pair (its builder merges them); here readers of one tensor with equal scale and zero point share the Q.
5. **Dequantized weights of unfused ops** (:func:`pipeline.runtime.ort.emulation.fold_unfused_weights`).
6. **int32 biases of integer convolutions** (:func:`integer_biases`): ONNX Runtime's QLinearConv adds the bias to
   its int32 accumulator, so a ``DQ -> Conv -> Q`` with a float bias is fused only after its
   ``WeightBiasQuantization`` stores the bias as ``round(b / (s_x * s_w))`` in int32. That rewrite also requantizes
   any float weight of a Conv that reads a DequantizeLinear to int8 *per tensor* (measured: the stem of the bundled
   CNN, whose weight rewrite 5 had dequantized, lost its per-channel weights), so the backend disables it
   (:data:`DISABLED_OPTIMIZERS`) and the biases are stored here, computed as it computes them (an integer
   convolution kernel has no float bias). Each bias moves by at most half of ``s_x * s_w``, one unit of the
   accumulator.
7. **Integer convolutions with a float output** (:mod:`pipeline.runtime.ort.integer_conv`): a ``DQ -> Conv`` whose
   output is not quantized (before a residual Add) becomes im2col and ``MatMulIntegerToFloat``: the 8-bit products
   summed exactly in int32 and scaled once, as TensorRT's INT8 kernels compute them, instead of ONNX Runtime's float
   Conv over dequantized values.
8. **uint8 weights where uint8 x int8 saturates** (:mod:`pipeline.runtime.ort.saturation`): on x86 CPUs without VNNI,
   ONNX Runtime's uint8 x int8 kernels add products in pairs in a saturating int16; there every int8 weight becomes
   uint8 with zero point 128 (the same values), which its exact uint8 x uint8 kernels take.

Rewrite 0 is the one that changes values by more than float32 rounding, and the default
(``Settings.ort_int8_conv_outputs="requantize"``; ``"exact"`` leaves it out). It runs after rewrite 1, whose exact
form it must not take the place of:

0. **Requantized convolution outputs** (:func:`requantize_conv_outputs`). TensorRT fuses a quantized convolution with
   the residual Add after it and keeps the convolution's output in its accumulator (:mod:`passes.quantize.residual`),
   so TensorRT's graph leaves that output float (a convolution read only by Adds). ONNX Runtime's CPU provider has no
   fast integer convolution with a float output: rewrite 7's im2col costs as much as the integer product saves below
   32 channels, and ONNX Runtime's own ``ConvInteger`` is 7x slower than its float Conv (measured, 16x16x32x32 -> 16
   channels, 2 threads: 3.5 ms against 0.50 ms; QLinearConv 0.25 ms). Here the output gets a Q/DQ pair of its own,
   INT8 per tensor with the range the quantize stage calibrated for it (:func:`record_conv_output_ranges`, the
   model's ``metadata_props``), as ``onnxruntime.quantization`` places one: the convolution becomes QLinearConv and
   the residual Add QLinearAdd. That is one 8-bit rounding per such convolution more than TensorRT computes (as large
   as the rounding of the Add's quantized output); the quantize stage's accuracy search and validation tolerance are
   measured on this graph when the module runs on ONNX Runtime, and on the exact one when it is built for TensorRT.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes import to_graph, to_model
from passes.quantize.formats import QUANTIZED_OPS
from pipeline.runtime.ort.emulation import fold_unfused_weights
from pipeline.runtime.ort.integer_conv import MICROSOFT_DOMAIN, integer_float_convs
from pipeline.runtime.ort.saturation import u8s8_saturates, unsigned_weights

logger = logging.getLogger(__name__)

#: Ops with ``Q(op(x)) == op(Q(x))`` for a per-tensor Q with zero point 0 (monotonic, and op(0) == 0 for Relu).
MONOTONIC_OPS = ("Relu", "MaxPool")
_UINT8_ZERO = 128
#: ONNX Runtime graph optimizers a session of a Q/DQ graph runs without: ``WeightBiasQuantization`` requantizes
#: float weights per tensor (rewrite 6 of the module doc); ``QDQPropagationTransformer`` moves a QuantizeLinear
#: above a MaxPool, whose uint8 kernel in NCHW layout is 10x slower than the float NCHWc one (measured on the bundled
#: CNN's stem, 16x16x64x64: 16 ms against 1 ms); rewrite 3 moves the MaxPools that gain from it itself.
DISABLED_OPTIMIZERS = ("WeightBiasQuantization", "QDQPropagationTransformer")
#: A Conv with fewer input channels per group is left to ONNX Runtime's float kernel (rewrite 1 skips it): MLAS's
#: U8S8 convolution is slower there (measured, 16x3x64x64 -> 16 channels, 2 threads: 12 ms against 1.3 ms in
#: float32; from 8 input channels on it is as fast or faster).
MIN_INTEGER_CHANNELS = 8
#: The key of the model's ``metadata_props`` entry holding the calibrated ranges of convolution outputs (JSON: tensor
#: name -> amax), which rewrite 0 quantizes in ONNX Runtime's session only; TensorRT ignores it.
RANGES_KEY = "pipeline.ort_int8.conv_output_amax"
#: ``Settings.ort_int8_conv_outputs``: requantize the float outputs of integer convolutions (rewrite 0) or not.
CONV_OUTPUT_MODES = ("requantize", "exact")


def disabled_optimizers(model: onnx.ModelProto) -> list[str]:
    """The ONNX Runtime optimizers to disable for a session of ``model`` (:data:`DISABLED_OPTIMIZERS` when it holds
    QuantizeLinear or DequantizeLinear nodes, else none); pass as ``InferenceSession(..., disabled_optimizers=)``."""
    quantized = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    return list(DISABLED_OPTIMIZERS) if quantized else []


def record_conv_output_ranges(model: onnx.ModelProto, ranges: Mapping[str, float]) -> onnx.ModelProto:
    """A copy of ``model`` whose ``metadata_props`` hold ``ranges`` (tensor name -> calibrated amax of a quantized
    convolution's output) for rewrite 0 of the module doc; an empty ``ranges`` removes the entry."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [p for p in out.metadata_props if p.key != RANGES_KEY]
    del out.metadata_props[:]
    out.metadata_props.extend(kept)
    if ranges:
        values = {name: float(amax) for name, amax in sorted(ranges.items())}
        out.metadata_props.add(key=RANGES_KEY, value=json.dumps(values))
    return out


def conv_output_ranges(model: onnx.ModelProto) -> dict[str, float]:
    """The ranges :func:`record_conv_output_ranges` stored in ``model`` (empty when there are none)."""
    for prop in model.metadata_props:
        if prop.key == RANGES_KEY:
            return {str(name): float(amax) for name, amax in json.loads(prop.value).items()}
    return {}


def ort_int8_graph(model: onnx.ModelProto, conv_outputs: str = "requantize") -> onnx.ModelProto:
    """The INT8 Q/DQ graph rewritten for ONNX Runtime's CPU provider (see the module doc): the same values, more of
    it in integer kernels; with ``conv_outputs="requantize"`` (rewrite 0) also the float outputs of quantized
    convolutions whose range the model records, in 8 bits. ``model`` is not changed.

    >>> session_graph = ort_int8_graph(module.onnx)   # doctest: +SKIP
    """
    if conv_outputs not in CONV_OUTPUT_MODES:
        raise ValueError(f"conv_outputs must be one of {CONV_OUTPUT_MODES}, not {conv_outputs!r}")
    graph, metadata = to_graph(model)
    outputs = quantize_weighted_outputs(graph)
    requantized = requantize_conv_outputs(graph, conv_output_ranges(model)) if conv_outputs == "requantize" else []
    switched = switch_to_uint8(graph)
    integer = integer_relu_and_pool(graph)
    shared = share_quantize(graph)
    biases = integer_biases(graph)
    convs = integer_float_convs(graph)
    graph.cleanup().toposort()
    logger.debug(
        "onnxruntime int8 graph: %d convolution outputs requantized, %d outputs quantized, %d pairs in uint8, "
        "%d integer Relu/MaxPool, %d Q shared, %d int32 biases, %d integer convolutions with a float output",
        len(requantized),
        outputs,
        switched,
        integer,
        shared,
        biases,
        convs,
    )
    rewritten = to_model(graph, model, metadata)
    if convs and not any(o.domain == MICROSOFT_DOMAIN for o in rewritten.opset_import):
        rewritten.opset_import.append(onnx.helper.make_opsetid(MICROSOFT_DOMAIN, 1))
    folded = fold_unfused_weights(rewritten)
    if u8s8_saturates():  # rewrite 8
        folded, count = unsigned_weights(folded)
        logger.debug(
            "onnxruntime int8 graph: %d int8 weights as uint8 (this CPU's uint8 x int8 kernels saturate)", count
        )
    return folded


def quantize_weighted_outputs(graph: gs.Graph) -> int:
    """Rewrite 1 of the module doc: the output of a quantized weighted op read through Relu/MaxPool by
    QuantizeLinears of one scale is quantized with that scale first, and after each op of the chain; so is the float
    output of any other op read through Relus only (a residual ``Add -> Relu -> Q`` becomes ``Add -> Q`` and an
    integer Relu). The number of outputs so treated.

    A MaxPool joins a chain only after a weighted op that becomes an integer kernel: ONNX Runtime then runs it in
    NHWC beside that kernel, where elsewhere its uint8 MaxPool runs in NCHW, 10x slower than the float one."""
    done = 0
    outputs = {t.name for t in graph.outputs}
    for node in list(graph.nodes):
        if node.op in QUANTIZED_OPS:
            if not _reads_dequantized(node) or _few_channels(node):
                continue
            chain = _monotonic_chain(node.outputs[0], outputs, MONOTONIC_OPS)
        elif node.op in (*MONOTONIC_OPS, "QuantizeLinear", "DequantizeLinear") or len(node.outputs) != 1:
            continue
        else:
            chain = _monotonic_chain(node.outputs[0], outputs, ("Relu",))
        if not chain:
            continue
        scale, zero = _common_quantization(chain[-1].outputs[0])
        if scale is None or zero is None or np.asarray(zero.values).astype(np.int64).any():
            continue
        tensors = [node.outputs[0]] + [op.outputs[0] for op in chain[:-1]]
        readers = [chain[0]] + chain[1:]
        for tensor, reader in zip(tensors, readers, strict=True):
            reader.inputs[0] = _pair(graph, tensor, scale, zero, f"{tensor.name}/ort_output")
        done += 1
    return done


def requantize_conv_outputs(graph: gs.Graph, ranges: Mapping[str, float]) -> list[str]:
    """Rewrite 0 of the module doc: the float output of every ``DQ(per tensor, float32 scale) -> Conv(DQ(int8
    weight))`` whose range ``ranges`` holds, read by Adds only (the residual Adds TensorRT fuses) and not a graph
    output, is read through an INT8 Q/DQ pair with that range; the names of the outputs so quantized."""
    from passes.quantize.formats import FORMATS

    done = []
    outputs = {t.name for t in graph.outputs}
    for node in [n for n in graph.nodes if n.op == "Conv"]:
        result = node.outputs[0]
        amax = ranges.get(result.name, 0.0)
        if amax <= 0 or not np.isfinite(amax) or result.name in outputs or not result.outputs:
            continue
        if any(reader.op != "Add" for reader in result.outputs) or _few_channels(node):
            continue
        if not _integer_conv_operands(node):
            continue
        scale = gs.Constant(f"{result.name}/ort_requantize_scale", np.asarray(FORMATS["int8"].scale_for(amax)))
        zero = gs.Constant(f"{result.name}/ort_requantize_zero", np.array(0, np.int8))
        readers = list(result.outputs)
        restored = _pair(graph, result, scale, zero, f"{result.name}/ort_requantized")
        for reader in readers:
            reader.inputs = [restored if t is result else t for t in reader.inputs]
        done.append(result.name)
    return done


def _integer_conv_operands(node: gs.Node) -> bool:
    """Are a Conv's inputs a per-tensor ``DequantizeLinear`` with a float32 scale and a constant int8 weight's
    ``DequantizeLinear`` (the ``DQ -> Conv`` ONNX Runtime fuses with a trailing Q)?"""
    data, weight = node.inputs[0], node.inputs[1]
    if len(data.inputs) != 1 or len(weight.inputs) != 1:
        return False
    activation, weights = data.inputs[0], weight.inputs[0]
    if activation.op != "DequantizeLinear" or weights.op != "DequantizeLinear" or _axis_of(activation):
        return False
    scale, stored = activation.inputs[1], weights.inputs[0]
    if not isinstance(scale, gs.Constant) or np.asarray(scale.values).dtype != np.float32:
        return False  # a float16 graph runs as its float32 emulation: left as it is
    return isinstance(stored, gs.Constant) and np.asarray(stored.values).dtype == np.int8


def _few_channels(node: gs.Node) -> bool:
    """Is ``node`` a Conv with fewer than :data:`MIN_INTEGER_CHANNELS` input channels per group?"""
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if node.op != "Conv" or weight is None or weight.shape is None or len(weight.shape) < 2:
        return False
    channels = weight.shape[1]
    return isinstance(channels, int) and channels < MIN_INTEGER_CHANNELS


def _monotonic_chain(tensor: gs.Tensor, outputs: set[str], ops: tuple[str, ...]) -> list[gs.Node]:
    """The nodes of ``ops`` that read ``tensor`` one after another, each the only reader of its input."""
    chain: list[gs.Node] = []
    while tensor.name not in outputs and len(tensor.outputs) == 1:
        reader = tensor.outputs[0]
        if reader.op not in ops or len([o for o in reader.outputs if o.outputs or o.name in outputs]) != 1:
            break
        chain.append(reader)
        tensor = reader.outputs[0]
    return chain if chain and tensor.name not in outputs else []


def _reads_dequantized(node: gs.Node) -> bool:
    data = node.inputs[0]
    return bool(data.inputs) and data.inputs[0].op == "DequantizeLinear"


def _common_quantization(tensor: gs.Tensor) -> tuple[gs.Constant | None, gs.Constant | None]:
    """The per-tensor scale and zero point every reader of ``tensor`` quantizes it with, or Nones."""
    readers = list(tensor.outputs)
    if not readers or any(r.op != "QuantizeLinear" or len(r.inputs) < 3 or _axis_of(r) for r in readers):
        return None, None
    scales, zeros = [r.inputs[1] for r in readers], [r.inputs[2] for r in readers]
    if not all(isinstance(c, gs.Constant) and np.asarray(c.values).size == 1 for c in scales + zeros):
        return None, None
    if not all(_same(c, scales[0]) for c in scales) or not all(_same(z, zeros[0]) for z in zeros):
        return None, None
    return scales[0], zeros[0]


def _axis_of(node: gs.Node) -> bool:
    """Does the Q/DQ node quantize per axis (a non-scalar scale)?"""
    return np.asarray(node.inputs[1].values).size != 1 if isinstance(node.inputs[1], gs.Constant) else True


def _same(a: gs.Tensor, b: gs.Tensor) -> bool:
    if not (isinstance(a, gs.Constant) and isinstance(b, gs.Constant)):
        return False
    left, right = np.asarray(a.values), np.asarray(b.values)
    return left.dtype == right.dtype and left.shape == right.shape and left.tobytes() == right.tobytes()


def _pair(graph: gs.Graph, source: gs.Tensor, scale: gs.Constant, zero: gs.Constant, base: str) -> gs.Variable:
    """``source -> Q -> DQ`` with copies of ``scale`` and ``zero``."""
    scale_c = gs.Constant(f"{base}/scale", np.array(scale.values))
    zero_c = gs.Constant(f"{base}/zero_point", np.array(zero.values))
    quantized = gs.Variable(f"{base}/quantized", dtype=np.asarray(zero.values).dtype, shape=source.shape)
    restored = gs.Variable(f"{base}/dequantized", dtype=np.asarray(scale.values).dtype, shape=source.shape)
    graph.nodes.append(gs.Node("QuantizeLinear", f"{base}/Q", inputs=[source, scale_c, zero_c], outputs=[quantized]))
    graph.nodes.append(
        gs.Node("DequantizeLinear", f"{base}/DQ", inputs=[quantized, scale_c, zero_c], outputs=[restored])
    )
    return restored


def switch_to_uint8(graph: gs.Graph) -> int:
    """Rewrite 2 of the module doc: every per-tensor int8 activation QuantizeLinear with zero point 0 whose readers
    are all DequantizeLinears becomes uint8 with zero point 128, and so do its readers; the number of Qs switched."""
    done = 0
    outputs = {t.name for t in graph.outputs}
    for node in [n for n in graph.nodes if n.op == "QuantizeLinear"]:
        quantized = node.outputs[0]
        if len(node.inputs) < 3 or _axis_of(node) or quantized.name in outputs:
            continue
        zero = node.inputs[2]
        if not isinstance(zero, gs.Constant) or np.asarray(zero.values).dtype != np.int8:
            continue
        if np.asarray(zero.values).any() or any(r.op != "DequantizeLinear" for r in quantized.outputs):
            continue
        shifted = gs.Constant(f"{quantized.name}/uint8_zero_point", np.array(_UINT8_ZERO, dtype=np.uint8))
        for user in [node, *quantized.outputs]:
            user.inputs[2] = shifted
        quantized.dtype = np.uint8
        done += 1
    return done


def integer_relu_and_pool(graph: gs.Graph) -> int:
    """Rewrite 3 of the module doc: ``DQ -> Relu|MaxPool -> Q`` with the same scale and zero point runs on the 8-bit
    tensor (``Max(q, z)``, ``MaxPool(q)``); the number of ops so moved."""
    done = 0
    outputs = {t.name for t in graph.outputs}
    for node in [n for n in graph.nodes if n.op in MONOTONIC_OPS]:
        source = node.inputs[0]
        if len(source.inputs) != 1 or source.inputs[0].op != "DequantizeLinear" or len(node.outputs) != 1:
            continue
        dequantize = source.inputs[0]
        if _axis_of(dequantize) or len(dequantize.inputs) < 3:
            continue
        scale, zero = _common_quantization(node.outputs[0])
        if scale is None or zero is None or not _same(scale, dequantize.inputs[1]):
            continue
        if not _same(zero, dequantize.inputs[2]) or any(r.outputs[0].name in outputs for r in node.outputs[0].outputs):
            continue
        quantized = dequantize.inputs[0]
        result = gs.Variable(f"{node.outputs[0].name}/integer", dtype=quantized.dtype, shape=node.outputs[0].shape)
        if node.op == "Relu":
            floor = gs.Constant(f"{node.name}/integer_zero", np.array(np.asarray(zero.values)))
            graph.nodes.append(gs.Node("Max", f"{node.name}/integer", inputs=[quantized, floor], outputs=[result]))
        else:
            graph.nodes.append(
                gs.Node("MaxPool", f"{node.name}/integer", attrs=dict(node.attrs), inputs=[quantized], outputs=[result])
            )
        for reader in list(node.outputs[0].outputs):
            for consumer in list(reader.outputs[0].outputs):
                consumer.inputs[consumer.inputs.index(reader.outputs[0])] = result
        done += 1
    graph.cleanup()
    return done


def share_quantize(graph: gs.Graph) -> int:
    """Rewrite 4 of the module doc: QuantizeLinears of one tensor with equal scale and zero point become one; the
    number removed."""
    removed = 0
    outputs = {t.name for t in graph.outputs}
    for tensor in list(graph.tensors().values()):
        kept: list[gs.Node] = []
        for node in [n for n in tensor.outputs if n.op == "QuantizeLinear" and n.inputs[0] is tensor]:
            if node.outputs[0].name in outputs or len(node.inputs) < 3:
                continue
            twin = next(
                (k for k in kept if _same(k.inputs[1], node.inputs[1]) and _same(k.inputs[2], node.inputs[2])), None
            )
            if twin is None:
                kept.append(node)
                continue
            for consumer in list(node.outputs[0].outputs):
                consumer.inputs[consumer.inputs.index(node.outputs[0])] = twin.outputs[0]
            node.outputs.clear()
            removed += 1
    graph.cleanup()
    return removed


def integer_biases(graph: gs.Graph) -> int:
    """Rewrite 6 of the module doc: the float bias of every ``DQ -> Conv -> Q`` becomes ``DequantizeLinear(int32,
    scale = s_x * s_w)``, as ONNX Runtime's integer convolution takes it; the number of biases so stored."""
    done = 0
    outputs = {t.name for t in graph.outputs}
    for node in [n for n in graph.nodes if n.op == "Conv" and len(n.inputs) == 3]:
        bias = node.inputs[2]
        if not isinstance(bias, gs.Constant) or np.asarray(bias.values).dtype != np.float32:
            continue
        scales = _fused_scales(node, outputs)
        if scales is None:
            continue
        scale = (np.float32(scales[0]) * scales[1]).astype(np.float32)  # the Mul ONNX Runtime's own rewrite makes
        values = np.asarray(bias.values, np.float32)
        stored = np.rint(values / np.broadcast_to(scale, values.shape)).astype(np.int32)
        base = f"{node.name}/int32_bias"
        restored = gs.Variable(f"{base}/dequantized", dtype=np.float32, shape=list(values.shape))
        graph.nodes.append(
            gs.Node(
                "DequantizeLinear",
                f"{base}/DQ",
                attrs={"axis": 0},
                inputs=[gs.Constant(f"{base}/values", stored), gs.Constant(f"{base}/scale", scale)],
                outputs=[restored],
            )
        )
        node.inputs[2] = restored
        done += 1
    return done


def _fused_scales(node: gs.Node, outputs: set[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """The activation and weight scales of a Conv in the ``DQ -> Conv -> Q`` form ONNX Runtime fuses (per-tensor
    activation, weight per output channel or per tensor, one Q reader), else None."""
    data, weight, result = node.inputs[0], node.inputs[1], node.outputs[0]
    if len(result.outputs) != 1 or result.outputs[0].op != "QuantizeLinear" or result.name in outputs:
        return None
    if len(data.inputs) != 1 or len(weight.inputs) != 1:
        return None
    activation, weights = data.inputs[0], weight.inputs[0]
    if activation.op != "DequantizeLinear" or weights.op != "DequantizeLinear" or _axis_of(activation):
        return None
    if not all(isinstance(t, gs.Constant) for t in (activation.inputs[1], weights.inputs[0], weights.inputs[1])):
        return None
    return np.asarray(activation.inputs[1].values, np.float32), np.asarray(weights.inputs[1].values, np.float32)
