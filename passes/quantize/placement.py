"""Where Q/DQ pairs go: the placement rules of explicit quantization, as TensorRT and NVIDIA ModelOpt apply them.

The rules followed (facts from TensorRT's "Explicit Quantization" guide, section "Q/DQ Layer-Placement
Recommendations", and from ModelOpt's ONNX Q/DQ graph policy, ``modelopt.onnx.quantization``):

* Quantize all inputs of weighted operations (Convolution, Transposed Convolution, GEMM: ONNX Conv, ConvTranspose,
  MatMul, Gemm): the activation per tensor, the weight per output channel. TensorRT then runs the op in the 8-bit
  type and fuses the DequantizeLinear pair into it.
* Do not quantize the outputs of weighted operations by default: TensorRT's guide keeps them in the higher type
  so that a following activation (its example: SiLU) reads precise values. The one exception
  (:func:`passes.quantize.insert.quantize_relu_inputs`) is exact: ``Conv -> Relu -> Q(s)`` may become
  ``Conv -> Q(s) -> DQ -> Relu -> Q(s)`` without changing a value, and ONNX Runtime needs that form to fuse the
  convolution (INT8 only).
* Weights are symmetric and per channel along the output-channel axis: axis 0 of a Conv weight (K, C/g, kH, kW),
  axis 1 of a ConvTranspose weight (C, K/g, kH, kW), the last axis of a MatMul's constant (K, N) right-hand side,
  and for Gemm axis 0 with ``transB=1`` (N, K), else 1. TensorRT takes weights already quantized (an int8/fp8
  initializer followed by DequantizeLinear) and stores them as they are.
* A residual Add after a quantized convolution: its skip input is quantized and its convolution input is not
  (:mod:`passes.quantize.residual`), so that TensorRT fuses the Add into the convolution with an 8-bit output.
* No Q/DQ between data-movement ops (pooling, Concat, Reshape, Transpose): TensorRT commutes Q/DQ across them and
  a pair in between forces a reformat; placing pairs only directly at weighted inputs never creates one.
* A tensor that feeds several quantized ops gets one Q/DQ pair per reader, all with the tensor's one scale: the
  same 8-bit values for every reader (TensorRT merges the copies), and the form ONNX Runtime fuses
  (:mod:`passes.quantize.insert`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from passes.precision.convert import match_keep_fp32
from passes.quantize.formats import QUANTIZED_OPS
from passes.records import Skipped

#: The weighted ops whose inputs are quantized.


@dataclass(frozen=True)
class Target:
    """One op to quantize: its activation input (position) and its constant weight (position, channel axis)."""

    node: str
    op: str
    activation: int  # the input position of the activation
    weight: int | None  # the input position of the constant weight, None when both inputs are activations
    axis: int | None  # the weight's output-channel axis; None: one scale for the weight (per tensor)


def plan_targets(graph: gs.Graph, keep: Sequence[str] = ()) -> tuple[list[Target], list[Skipped]]:
    """The weighted ops to quantize and the ones skipped, with reasons. ``keep`` are ``keep_fp32`` entries
    (``node:``, ``op:``, ``module:``, as for fp16): those nodes stay unquantized."""
    kept, _ = match_keep_fp32(graph.nodes, keep)
    targets: list[Target] = []
    skipped: list[Skipped] = []
    for node in graph.nodes:
        if node.op not in QUANTIZED_OPS or node.domain not in ("", None, "ai.onnx"):
            continue
        if node.name in kept:
            skipped.append(Skipped(node.name, node.op, f"keep_fp32 entry {kept[node.name]!r}"))
            continue
        target = _target(node)
        if isinstance(target, str):
            skipped.append(Skipped(node.name, node.op, target))
        else:
            targets.append(target)
    return targets, skipped


def _target(node: gs.Node) -> Target | str:
    """The quantization of one weighted op, or the reason it is skipped."""
    if len(node.inputs) < 2:
        return "fewer than two inputs"
    data, weight = node.inputs[0], node.inputs[1]
    if isinstance(data, gs.Constant):
        return "its first input is a constant (nothing to calibrate)"
    if not isinstance(weight, gs.Constant):
        # activation x activation (attention's Q.K^T and P.V): TensorRT can quantize these too (ModelOpt does for
        # FP8 attention), but they are not weighted ops and their ranges move with the sequence: left in float
        return "both inputs are activations (no constant weight)"
    shape = tuple(weight.shape)
    if node.op == "Conv":
        return Target(node.name, node.op, 0, 1, 0)
    if node.op == "ConvTranspose":
        return Target(node.name, node.op, 0, 1, 1)
    if node.op == "Gemm":
        if int(node.attrs.get("transA", 0)):
            return "Gemm with transA=1 (its activation would be quantized transposed)"
        return Target(node.name, node.op, 0, 1, 0 if int(node.attrs.get("transB", 0)) else 1)
    # MatMul: a (K, N) weight has one scale per output column; a batched constant gets one scale (per tensor)
    return Target(node.name, node.op, 0, 1, len(shape) - 1 if len(shape) == 2 else None)
