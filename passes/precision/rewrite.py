"""Applying a precision plan: retype tensors, convert weights and attributes, cast where types meet.

Every cast is named after the node (or graph input, or weight) whose value it converts, so a cast in an engine
or a report points back at its PyTorch module. One cast per tensor and type, shared by every consumer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
import onnx_graphsurgeon as gs

from converters.context import unique_name
from passes.precision.control_flow import has_bodies, outer_references, replace_in_bodies
from passes.precision.types import FLOAT, LowType, float_slots, onnx_opset

Decision = Literal["low", "fp32", "neutral"]

_ALL = frozenset(range(64))


def rewrite(
    graph: gs.Graph, decisions: Mapping[str, Decision], low: LowType, float32: frozenset[str], low_io: bool = False
) -> None:
    """Rewrite ``graph`` in place: nodes decided "low" compute in ``low``; the rest read float32.

    ``float32`` names the tensors that were float32 before the rewrite (the only ones it touches). Graph inputs and
    outputs stay float32 (casts at the boundary), or with ``low_io`` become ``low`` themselves (names kept). Bodies
    of control flow are not retyped: what they read from outside by name is cast back to float32
    (:mod:`passes.precision.control_flow`).
    """
    opset = onnx_opset(graph)
    converted: set[str] = set()
    if low_io:
        for tensor in graph.inputs:
            if tensor.name in float32:
                tensor.dtype = low.gs_dtype
                converted.add(tensor.name)
    for node in graph.nodes:
        if decisions.get(node.name) == "low":
            converted |= _retype_outputs(node, low, opset, float32)
    casts = _Casts(graph, low)
    constant_wants: dict[str, list[tuple[gs.Node, int, bool]]] = {}
    for node in list(graph.nodes):
        decision = decisions.get(node.name)
        if decision in (None, "neutral"):
            continue
        slots = _in_slots(node, low, opset) if decision == "low" else frozenset()
        for index, tensor in enumerate(node.inputs):
            if not tensor.name or tensor.name not in float32:
                continue
            want_low = index in slots
            if isinstance(tensor, gs.Constant):
                constant_wants.setdefault(tensor.name, []).append((node, index, want_low))
            elif (tensor.name in converted) != want_low:
                node.inputs[index] = casts.get(tensor, want_low)
    _convert_constants(graph, constant_wants, low)
    _cast_outer_references(graph, converted, casts)
    if low_io:
        _cast_graph_outputs(graph, {t.name for t in graph.outputs if t.name in float32} - converted, casts, to_low=True)
    else:
        _cast_graph_outputs(graph, converted, casts, to_low=False)
    graph.cleanup(remove_unused_graph_inputs=False)
    graph.toposort()


def _cast_outer_references(graph: gs.Graph, converted: set[str], casts: _Casts) -> None:
    """A value a Loop, If or Scan body reads from outside, now in the low type, is read through a float32 cast (the
    same cast the node's explicit inputs share), whatever the node's own decision."""
    for node in list(graph.nodes):
        if not has_bodies(node):
            continue
        for tensor in outer_references(node):
            if tensor.name in converted:
                replace_in_bodies(node, tensor, casts.get(tensor, to_low=False))


def _in_slots(node: gs.Node, low: LowType, opset: int) -> frozenset[int]:
    if node.op == "Cast":
        return _ALL
    slots = float_slots(node.op, opset, low)
    return _ALL if isinstance(slots, str) else slots[0]


def _retype_outputs(node: gs.Node, low: LowType, opset: int, float32: frozenset[str]) -> set[str]:
    """Set the low type on a low node's float32 outputs (and on the attributes that decide them)."""
    if node.op in ("Constant", "ConstantOfShape"):
        _retype_value_attribute(node, low)
    elif node.op == "Cast" and node.attrs.get("to") == FLOAT:
        node.attrs["to"] = low.onnx_type
    if node.attrs.get("dtype") == FLOAT:
        node.attrs["dtype"] = low.onnx_type
    slots = float_slots(node.op, opset, low)
    out_slots = _ALL if isinstance(slots, str) or node.op == "Cast" else slots[1]
    retyped = set()
    for index, tensor in enumerate(node.outputs):
        if tensor.name in float32 and index in out_slots:
            tensor.dtype = low.gs_dtype
            retyped.add(tensor.name)
    return retyped


def _retype_value_attribute(node: gs.Node, low: LowType) -> None:
    value = node.attrs.get("value")
    if "value_float" in node.attrs:
        value = gs.Constant(f"{node.name}_value", np.array(node.attrs.pop("value_float"), np.float32))
    elif "value_floats" in node.attrs:
        value = gs.Constant(f"{node.name}_value", np.array(node.attrs.pop("value_floats"), np.float32))
    elif value is None and node.op == "ConstantOfShape":
        value = gs.Constant(f"{node.name}_value", np.zeros(1, np.float32))
    if isinstance(value, gs.Constant) and value.values.dtype == np.float32:
        node.attrs["value"] = gs.Constant(value.name, value.values.astype(low.numpy_type))


def _convert_constants(graph: gs.Graph, wants: Mapping[str, list[tuple[gs.Node, int, bool]]], low: LowType) -> None:
    """A weight only low nodes read is converted in place (its name kept); one read both ways gets a low copy."""
    taken: set[str] | None = None
    for uses in wants.values():
        constant = uses[0][0].inputs[uses[0][1]]
        low_uses = [(node, index) for node, index, want_low in uses if want_low]
        if not low_uses:
            continue
        values = constant.values.astype(low.numpy_type)
        if len(low_uses) == len(uses) and len(constant.outputs) == len(uses):
            constant.values = values
            continue
        if taken is None:  # names are needed only for a weight read both ways
            taken = set(graph.tensors()) | {n.name for n in graph.nodes}
        copy = gs.Constant(unique_name(f"{constant.name}_{low.name}", taken), values)
        for node, index in low_uses:
            node.inputs[index] = copy


def _cast_graph_outputs(graph: gs.Graph, names: set[str], casts: _Casts, to_low: bool) -> None:
    """Graph outputs ``names`` change type (to float32, or to the low type): the tensor is renamed and a cast produces
    the output under its name. A float32 output cast to the low type saturates first (``Clip`` to the low type's
    largest finite value): an output a float32 island kept computes values beyond that range on purpose
    (``finfo(float32).min`` masking Chameleon's image-token logits), which a plain cast makes ``-inf``, where the
    model in the low type itself writes its own type's lowest value."""
    tag, dtype, to = (
        (casts.low.name, casts.low.gs_dtype, casts.low.onnx_type) if to_low else ("fp32", np.float32, FLOAT)
    )
    for position, tensor in enumerate(list(graph.outputs)):
        if tensor.name not in names:
            continue
        name = tensor.name
        tensor.name = casts.unique(f"{name}_{'fp32' if to_low else casts.low.name}")
        output = gs.Variable(name, dtype=dtype, shape=tensor.shape)
        origin = tensor.inputs[0].name if tensor.inputs else name
        cast_from: gs.Tensor = tensor
        if to_low:
            bound = float(casts.low.max_finite)
            limits = [gs.Constant(casts.unique(f"{name}_{side}"), np.array(v, np.float32)) for side, v in
                      (("lowest", -bound), ("highest", bound))]  # fmt: skip
            cast_from = gs.Variable(casts.unique(f"{name}_saturated"), dtype=np.float32, shape=tensor.shape)
            graph.nodes.append(gs.Node("Clip", casts.unique(f"{origin}/saturate"), {}, [tensor, *limits], [cast_from]))
        graph.nodes.append(gs.Node("Cast", casts.unique(f"{origin}/to_{tag}"), {"to": to}, [cast_from], [output]))
        graph.outputs[position] = output


class _Casts:
    """One Cast per (tensor, type), named after the node whose value it converts."""

    def __init__(self, graph: gs.Graph, low: LowType) -> None:
        self.graph = graph
        self.low = low
        self.made: dict[tuple[str, bool], gs.Variable] = {}
        self.names = {n.name for n in graph.nodes} | set(graph.tensors())

    def unique(self, name: str) -> str:
        candidate, count = name, 1
        while candidate in self.names:
            count += 1
            candidate = f"{name}_{count}"
        self.names.add(candidate)
        return candidate

    def get(self, tensor: gs.Tensor, to_low: bool) -> gs.Variable:
        key = (tensor.name, to_low)
        if key not in self.made:
            tag = self.low.name if to_low else "fp32"
            origin = tensor.inputs[0].name if tensor.inputs else tensor.name
            dtype = self.low.gs_dtype if to_low else np.float32
            output = gs.Variable(self.unique(f"{tensor.name}/{tag}"), dtype=dtype, shape=tensor.shape)
            to = self.low.onnx_type if to_low else FLOAT
            self.graph.nodes.append(gs.Node("Cast", self.unique(f"{origin}/to_{tag}"), {"to": to}, [tensor], [output]))
            self.made[key] = output
        return self.made[key]
