"""Residual Adds: which input of an ``Add`` after a quantized convolution is the residual (skip) input, the one that
gets a Q/DQ pair so that TensorRT fuses the Add into the convolution.

The rules (cited, not invented):

* TensorRT, "Explicit Quantization" -> "Q/DQ Layer-Placement Recommendations": *quantize the residual input in skip
  connections*. TensorRT fuses an element-wise addition that follows a weighted layer into that layer; the precision
  of the Add's other (residual) input decides the precision of the fused output: a float residual input limits the
  fused convolution to a float output and the next Q cannot be fused, an INT8 residual input gives an INT8 output and
  the trailing Q fuses too. The same section warns that an extra Q/DQ pair between the convolution and the Add
  "forces the separation" of the two: the convolution side of the Add gets no pair.
* NVIDIA ModelOpt, ``modelopt.onnx.quantization.graph_utils.build_non_residual_input_map``: an Add input whose
  producer is a fusible convolution (the "backbone": Conv or ConvTranspose, possibly through BatchNormalization) is
  the non-residual input; when both inputs have a backbone, the one on the longer path to the two inputs' lowest
  common ancestor is the non-residual input; when the only backbone is itself that ancestor (Conv -> ... -> Add and
  Conv -> Add), the Add is not a residual Add. The residual input is the other one.

>>> plan_residuals(graph, targets)   # doctest: +SKIP
[Target(node='node_add', op='Add', activation=1, weight=None, axis=None)]
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_graphsurgeon as gs

from passes.quantize.placement import Target

#: Ops TensorRT fuses into a convolution between it and the Add (ModelOpt's fusible paths, BN not yet folded).
_FUSIBLE_BETWEEN = ("BatchNormalization",)
_BACKBONES = ("Conv", "ConvTranspose")


def plan_residuals(graph: gs.Graph, targets: Sequence[Target]) -> list[Target]:
    """The residual input of every two-input ``Add`` that follows a quantized convolution (see the module doc)."""
    quantized = {t.node for t in targets}
    residuals = []
    for node in graph.nodes:
        if node.op != "Add" or len(node.inputs) != 2:
            continue
        if any(isinstance(t, gs.Constant) or not t.inputs for t in node.inputs):
            continue  # a bias or a graph input: not a skip connection
        index = _residual_index(node, quantized)
        if index is not None:
            residuals.append(Target(node.name, node.op, index, None, None))
    return residuals


def _residual_index(add: gs.Node, quantized: set[str]) -> int | None:
    producers = [t.inputs[0] for t in add.inputs]
    backbones = [_backbone(p, quantized) for p in producers]
    if backbones[0] is None and backbones[1] is None:
        return None
    ancestor, depths = _lowest_common_ancestor(producers[0], producers[1])
    if backbones[0] is not None and backbones[1] is not None:
        if backbones[0] is backbones[1]:
            return None
        return 1 if depths[0] > depths[1] else 0  # the longer path is the convolution side
    side = 0 if backbones[0] is not None else 1
    if ancestor is backbones[side]:
        return None  # Conv -> x -> Add <- Conv: the convolution feeds both sides, no skip connection
    return 1 - side


def _backbone(node: gs.Node, quantized: set[str]) -> gs.Node | None:
    """The quantized convolution whose output reaches ``node``'s output through fusible ops only, if any."""
    while node.op in _FUSIBLE_BETWEEN and node.inputs and node.inputs[0].inputs:
        node = node.inputs[0].inputs[0]
    return node if node.op in _BACKBONES and node.name in quantized else None


def _ancestors(node: gs.Node) -> dict[int, tuple[gs.Node, int]]:
    """Every node ``node`` depends on (itself included), by id, with its shortest distance."""
    found: dict[int, tuple[gs.Node, int]] = {id(node): (node, 0)}
    frontier = [node]
    depth = 0
    while frontier:
        depth += 1
        following = []
        for current in frontier:
            for tensor in current.inputs:
                for parent in tensor.inputs:
                    if id(parent) not in found:
                        found[id(parent)] = (parent, depth)
                        following.append(parent)
        frontier = following
    return found


def _lowest_common_ancestor(a: gs.Node, b: gs.Node) -> tuple[gs.Node | None, tuple[int, int]]:
    """The common ancestor of ``a`` and ``b`` nearest to both, and each one's distance to it."""
    left, right = _ancestors(a), _ancestors(b)
    common = [(left[k][1] + right[k][1], k) for k in left.keys() & right.keys()]
    if not common:
        return None, (len(left), len(right))
    _, key = min(common)
    return left[key][0], (left[key][1], right[key][1])
