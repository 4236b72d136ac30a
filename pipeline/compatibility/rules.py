"""The parser's per-op restrictions, as rules on one node. Each rule returns (reason, fix) pairs.

Restrictions and type lists come from the TensorRT 11.1 ONNX operator matrix (``pipeline/compatibility/data``);
behaviour facts (UINT8 only at graph inputs/outputs, DOUBLE cast down, dispatch on op_type) from the parser's source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from passes.parser_fixes.average_pool import max_window_volume
from pipeline.compatibility.ops import OpSupport

Problem = tuple[str, str]

_TYPE_TOKENS: dict[int, str] = {
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.BFLOAT16: "BF16",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.BOOL: "BOOL",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.FLOAT8E4M3FN: "FP8",
    onnx.TensorProto.INT4: "INT4",
}
_FOLD = "fold it to a constant (the default pass list folds constants), or compute it outside the model"
_REDUCE_OPS = {
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
}


@dataclass(frozen=True)
class GraphFacts:
    """What the rules need to know about the whole graph."""

    types: dict[str, int]
    ranks: dict[str, int]
    constants: dict[str, np.ndarray]
    graph_io: frozenset[str]
    consumed: frozenset[str]
    version: tuple[int, ...]

    @classmethod
    def of(cls, model: onnx.ModelProto, version: tuple[int, ...]) -> GraphFacts:
        """The facts of ``model`` for TensorRT ``version``: tensor types and ranks, constants, graph inputs and
        outputs."""
        graph = model.graph
        types: dict[str, int] = {}
        ranks: dict[str, int] = {}
        for value in (*graph.input, *graph.output, *graph.value_info):
            tensor_type = value.type.tensor_type
            if tensor_type.elem_type:
                types[value.name] = tensor_type.elem_type
            if tensor_type.HasField("shape"):
                ranks[value.name] = len(tensor_type.shape.dim)
        constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer if not init.data_location}
        for init in graph.initializer:
            types[init.name] = init.data_type
            ranks[init.name] = len(init.dims)
            constants.setdefault(init.name, np.empty(0))
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        io = frozenset(v.name for v in (*graph.input, *graph.output))
        consumed = frozenset(i for n in graph.node for i in n.input) | frozenset(v.name for v in graph.output)
        return cls(types, ranks, constants, io, consumed, version)

    def constant(self, name: str) -> np.ndarray | None:
        """The value of tensor ``name`` when it is a constant, else None."""
        return self.constants.get(name)


def node_problems(node: onnx.NodeProto, facts: GraphFacts, support: OpSupport | None) -> list[Problem]:
    """Every restriction ``node`` violates (empty when the parser takes it)."""
    problems = _type_problems(node, facts, support)
    rule = _RULES.get(node.op_type)
    if rule is None and node.op_type in _REDUCE_OPS:
        rule = _reduce_axes
    if rule is not None:
        problems += rule(node, facts)
    return problems


def _attr(node: onnx.NodeProto, name: str, default: object = None) -> object:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _type_problems(node: onnx.NodeProto, facts: GraphFacts, support: OpSupport | None) -> list[Problem]:
    problems: list[Problem] = []
    for out in node.output:
        is_uint8 = facts.types.get(out) == onnx.TensorProto.UINT8
        if out and is_uint8 and out not in facts.graph_io and node.op_type != "Constant":
            problems.append(
                (
                    f"intermediate tensor {out!r} is UINT8; the parser takes UINT8 only at graph inputs and outputs",
                    "cast to INT32 or FP32 inside the graph",
                )
            )
    if support is None or not support.types:
        return problems
    data = _input(node, 1) if node.op_type == "Where" else next((i for i in node.input if i), "")
    elem = facts.types.get(data)
    token = _TYPE_TOKENS.get(elem) if elem is not None else None
    if token is not None and token not in support.types:
        problems.append(
            (
                f"input {data!r} is {token}; {node.op_type} takes {', '.join(sorted(support.types))}",
                "cast the input to a supported type (precision passes keep ops in supported types)",
            )
        )
    if elem is not None and elem not in _TYPE_TOKENS and elem != onnx.TensorProto.DOUBLE:
        name = onnx.TensorProto.DataType.Name(elem)
        problems.append((f"input {data!r} has type {name}, which TensorRT does not support", "cast it"))
    return problems


def _must_be_constant(node: onnx.NodeProto, facts: GraphFacts, index: int, what: str) -> list[Problem]:
    name = _input(node, index)
    if name and facts.constant(name) is None:
        return [(f"{what} ({name!r}) must be an initializer / build-time constant", _FOLD)]
    return []


def _reduce_axes(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    return _must_be_constant(node, facts, 1, "`axes`")


def _squeeze(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    no_axes = not _input(node, 1) and _attr(node, "axes") is None
    if node.op_type == "Squeeze" and no_axes and facts.version[:2] < (11, 5):
        return [("Squeeze without `axes` is supported from TensorRT 11.5", "give the axes explicitly")]
    return _must_be_constant(node, facts, 1, "`axes`")


def _resize(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    problems: list[Problem] = []
    mode = _text(_attr(node, "mode", "nearest"))
    coordinate = _text(_attr(node, "coordinate_transformation_mode", "half_pixel"))
    nearest = _text(_attr(node, "nearest_mode", "round_prefer_floor"))
    policy = _text(_attr(node, "keep_aspect_ratio_policy", "stretch"))
    # mode 'cubic' is accepted: the 11.1 matrix lists nearest/linear only, the real parser takes cubic (calibration,
    # pipeline/compatibility/data/real_parser_calibration.csv)
    allowed = ("half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "asymmetric", "align_corners")
    if coordinate not in allowed:
        problems.append((f"coordinate_transformation_mode {coordinate!r} is not supported", f"use one of {allowed}"))
    if mode == "nearest" and nearest not in ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil"):
        problems.append((f"nearest_mode {nearest!r} is not supported", "use floor, ceil or round_prefer_*"))
    if _attr(node, "antialias", 0):
        problems.append(("antialias is not supported", "resize without antialiasing"))
    if policy != "stretch":
        problems.append((f"keep_aspect_ratio_policy {policy!r} is not supported", "use 'stretch'"))
    return problems


def _topk(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    problems: list[Problem] = []  # sorted=0 is accepted by the real parser, unlike the matrix's "must be 1"
    k = facts.constant(_input(node, 1))
    if k is not None and k.size == 1 and int(k.reshape(-1)[0]) >= 3840:
        problems.append((f"K = {int(k.reshape(-1)[0])} must be less than 3840", "split the selection or sort instead"))
    return problems


def _pool(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    problems: list[Problem] = []
    rank = facts.ranks.get(_input(node, 0))
    ranks = (3, 4, 5) if node.op_type in ("MaxPool", "AveragePool") else (4, 5)  # the parser reshapes 1D pooling
    if rank is not None and rank not in ranks:
        problems.append(
            (f"{node.op_type} on a rank-{rank} input: only 1D (Max/AveragePool), 2D and 3D pooling", "reshape to 4-D")
        )
    kernel = _attr(node, "kernel_shape")
    volume = int(np.prod(kernel)) if kernel else 0  # type: ignore[call-overload]
    limit = max_window_volume(len(kernel) if kernel else 0)  # type: ignore[arg-type]
    if volume >= limit:
        problems.append(
            (
                f"a window of {volume} elements: TensorRT's pooling takes fewer than {limit} in this rank",
                "a global pooling (AdaptiveAvgPool2d(1)) where one window covers the input; the parser fix "
                "'oversized_average_pool_to_global' does this for AveragePool",
            )
        )
    dilations = _attr(node, "dilations")
    if dilations and any(d != 1 for d in dilations):  # type: ignore[attr-defined]
        problems.append(("`dilations` must be empty or all ones", "pool without dilation"))
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1] in facts.consumed:
        problems.append(("the `Indices` output of MaxPool is unsupported", "do not use return_indices=True"))
    return problems


def _first_output_only(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    used = [o for o in node.output[1:] if o and o in facts.consumed]
    return [(f"only the first output is supported; {used} are used", "use only Y")] if used else []


def _dropout(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    name = _input(node, 2)
    value = facts.constant(name) if name else None
    if name and (value is None or value.size != 1 or bool(value.reshape(-1)[0])):
        return [("`training_mode` must be an initializer equal to False", "convert the model in eval mode")]
    return []


def _zero_point(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    name = _input(node, 2)
    value = facts.constant(name) if name else None
    if name and (value is None or (value.size and np.any(value != 0))):
        return [("the zero point must be a constant 0 (symmetric quantization only)", "quantize symmetrically")]
    return []


def _scatter_nd(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    reduction = _text(_attr(node, "reduction", "none"))
    return (
        [(f"ScatterND reduction {reduction!r} is not supported", "use reduction='none'")] if reduction != "none" else []
    )


def _attention(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    problems: list[Problem] = []
    for i in range(3):
        rank = facts.ranks.get(_input(node, i))
        if rank is not None and rank != 4:
            problems.append((f"Attention input {i} has rank {rank}; Q, K and V must be 4-D", "reshape to 4-D"))
    if any(_input(node, i) for i in range(4, len(node.input))):
        problems.append(("past_key/past_value/nonpad_kv_seqlen inputs are unsupported", "drop the KV cache inputs"))
    if any(o in facts.consumed for o in node.output[1:] if o):
        problems.append(("present_*/qk_matmul_output outputs are unsupported", "use only the first output"))
    if _attr(node, "qk_matmul_output_mode", 0) or _attr(node, "softcap", 0.0):
        problems.append(("qk_matmul_output_mode and softcap are unsupported", "leave them at their defaults"))
    return problems


def _grid_sample(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    rank = facts.ranks.get(_input(node, 0))
    if rank == 5 and facts.version[:2] < (11, 2):
        return [("5-D GridSample is supported from TensorRT 11.2", "use 4-D input or TensorRT >= 11.2")]
    return []


def _constant(node: onnx.NodeProto, facts: GraphFacts) -> list[Problem]:
    bad = {a.name for a in node.attribute} & {"sparse_value", "value_string", "value_strings"}
    return [(f"Constant with {sorted(bad)} is unsupported", "use a dense numeric constant")] if bad else []


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_RULES: dict[str, Callable[[onnx.NodeProto, GraphFacts], list[Problem]]] = {
    "Squeeze": _squeeze,
    "Unsqueeze": _squeeze,
    "Resize": _resize,
    "TopK": _topk,
    "AveragePool": _pool,
    "MaxPool": _pool,
    "LpPool": _pool,
    "LayerNormalization": _first_output_only,
    "Dropout": _dropout,
    "QuantizeLinear": _zero_point,
    "DequantizeLinear": _zero_point,
    "ScatterND": _scatter_nd,
    "Attention": _attention,
    "GridSample": _grid_sample,
    "Constant": _constant,
    "CumSum": lambda node, facts: _must_be_constant(node, facts, 1, "`axis`"),
    "OneHot": lambda node, facts: _must_be_constant(node, facts, 1, "`depth`"),
    "STFT": lambda node, facts: (
        _must_be_constant(node, facts, 1, "`frame_step`") + _must_be_constant(node, facts, 2, "`window`")
    ),
}
