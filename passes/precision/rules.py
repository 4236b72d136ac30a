"""Rules that keep nodes in float32 when a half type would overflow, lose precision or be rejected.

Each rule is pure: it looks at the graph and returns ``{node name: reason}``. Type rules (TensorRT's parser, the ONNX
schema, custom ops, control flow) always apply: breaking them makes a graph TensorRT or ONNX rejects. Accuracy
rules (normalization statistics and the normalized value, the residual stream a normalization reads, large
reductions, Exp/Pow/Log in fp16, cumulative sums, comparisons, routers, shape and index arithmetic, random generators,
constants beyond the half type's range) apply unless ``precision_rules=False``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.model_io.external_data import constant_values
from passes.precision.control_flow import has_bodies
from passes.precision.types import (
    FOLLOWER_OPS,
    Inferred,
    LowType,
    float_slots,
    is_float32,
    is_standard,
    shape_of,
    trt_accepts,
)

#: Comparisons of float values: their bool result costs nothing to compute in float32, and rounding their inputs to a
#: half type ties values that differ (a mixture-of-experts router's Less picked other experts in Kimi Linear).
COMPARISONS = frozenset({"Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal"})

#: A reduction over more elements than this accumulates enough rounding error to keep in float32.
LARGE_REDUCTION = 4096

NORMALIZATIONS = frozenset(
    {
        "LayerNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "RMSNormalization",
        "MeanVarianceNormalization",
        "LpNormalization",
    }
)
RANDOM = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}
)
REDUCTIONS = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "ReduceProd",
        "GlobalAveragePool",
        "GlobalLpPool",
    }
)
#: Ops whose result leaves float16's range for ordinary inputs (bfloat16 has float32's range).
FP16_RANGE = {
    "Exp": "Exp overflows float16 for inputs above 11.1",
    "Pow": "Pow leaves float16's range quickly (x**2 > 65504 once |x| > 256)",
    "Log": "Log of inputs below float16's smallest value (6e-8) is -inf",
    "ReduceSumSquare": "a sum of squares overflows float16 (x**2 > 65504 once |x| > 256)",
    "ReduceL2": "a sum of squares overflows float16 (x**2 > 65504 once |x| > 256)",
    "ReduceLogSumExp": "exponentials overflow float16 for inputs above 11.1",
    "ReduceProd": "a product overflows float16 quickly",
}
#: Ops through which a value beyond the half type's range reaches their output.
PASSES_RANGE = FOLLOWER_OPS | {"Add", "Sub", "Mul", "Neg", "Abs", "Sum", "Mean", "Cast", "Relu"}
_INTEGER_TYPES = frozenset(
    {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8}
    | {onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}
)


@dataclass(frozen=True)
class RuleContext:
    """What a precision rule reads: the graph, the low type, the inferred types and shapes, and the dynamic dims'
    maxima."""

    graph: gs.Graph
    low: LowType
    inferred: Inferred
    opset: int
    dim_max: Mapping[str, int]  # symbolic dimension name -> its declared maximum

    def float_tensors(self, node: gs.Node) -> list[gs.Tensor]:
        """The node's float32 inputs and outputs."""
        return [t for t in (*node.inputs, *node.outputs) if t is not None and t.name and is_float32(t, self.inferred)]


def type_islands(ctx: RuleContext) -> dict[str, str]:
    """Nodes that cannot take the half type at all: kept in float32 whatever the settings."""
    out = {}
    for node in ctx.graph.nodes:
        if ctx.float_tensors(node):
            reason = _type_reason(node, ctx)
            if reason:
                out[node.name] = reason
    return out


def _type_reason(node: gs.Node, ctx: RuleContext) -> str | None:
    if has_bodies(node):
        return f"control flow ({node.op}): runs in float32 with its bodies whole (see passes.precision.control_flow)"
    if not is_standard(node):
        return f"custom op {node.domain}::{node.op}: its types are its own"
    if node.op in FOLLOWER_OPS or node.op in ("Cast", "Constant", "ConstantOfShape", "Shape", "Size"):
        return None
    reason = trt_accepts(node.op, ctx.low)
    if reason:
        return reason
    slots = float_slots(node.op, ctx.opset, ctx.low)
    if isinstance(slots, str):
        return slots
    inputs, outputs = slots
    float_in = [i for i, t in enumerate(node.inputs) if t.name and is_float32(t, ctx.inferred)]
    float_out = [i for i, t in enumerate(node.outputs) if is_float32(t, ctx.inferred)]
    if any(i not in outputs for i in float_out) or (float_in and not any(i in inputs for i in float_in)):
        later = _first_opset_allowing(node.op, ctx)
        hint = f" (opset {later} does: export with opset={later})" if later else ""
        return f"ONNX opset {ctx.opset}'s {node.op} does not take {ctx.low.dtype_name}{hint}"
    return None


def _first_opset_allowing(op: str, ctx: RuleContext) -> int | None:
    for opset in range(ctx.opset + 1, onnx.defs.onnx_opset_version() + 1):
        slots = float_slots(op, opset, ctx.low)
        if not isinstance(slots, str) and slots[0] and slots[1]:
            return opset
    return None


def accuracy_islands(ctx: RuleContext) -> dict[str, str]:
    """Nodes a half type would make overflow or lose precision, first reason wins."""
    found: dict[str, str] = {}
    for rule in ACCURACY_RULES:
        for name, reason in rule(ctx).items():
            found.setdefault(name, reason)
    return found


def _per_node(ctx: RuleContext) -> dict[str, str]:
    out = {}
    for node in ctx.graph.nodes:
        if not ctx.float_tensors(node):
            continue
        reason = _node_reason(node, ctx)
        if reason:
            out[node.name] = reason
    return out


def _node_reason(node: gs.Node, ctx: RuleContext) -> str | None:
    if node.op in NORMALIZATIONS:
        if ctx.low.name == "fp16":
            return "normalization statistics: the variance overflows float16 once |x| > 256"
        return "normalization statistics lose precision with bfloat16's 8-bit mantissa"
    if node.op in RANDOM:
        return "random generator: its output type is fixed by its dtype attribute"
    if node.op == "CumSum":
        return "cumulative sum: rounding error grows along the axis"
    if node.op == "Range":
        return "index arithmetic: a float Range loses exact integers in a half type"
    if node.op in COMPARISONS:
        return "comparison: a half type rounds values apart to one and flips the decision (routing, masks)"
    if ctx.low.name == "fp16" and node.op in FP16_RANGE:
        return FP16_RANGE[node.op]
    if node.op in REDUCTIONS:
        count = _reduced_elements(node, ctx)
        if count is None or count > LARGE_REDUCTION:
            what = "an unknown number of" if count is None else f"{count}"
            return f"large reduction: accumulates {what} elements (more than {LARGE_REDUCTION})"
    return None


def _reduced_elements(node: gs.Node, ctx: RuleContext) -> int | None:
    shape = shape_of(node.inputs[0], ctx.inferred)
    if shape is None:
        return None
    axes = list(range(2, len(shape))) if node.op.startswith("Global") else _reduce_axes(node, len(shape))
    if axes is None:
        return None
    sizes = [shape[a] if isinstance(shape[a], int) else ctx.dim_max.get(str(shape[a])) for a in axes]
    return None if any(s is None for s in sizes) else math.prod(int(s) for s in sizes if s is not None)


def _reduce_axes(node: gs.Node, rank: int) -> list[int] | None:
    axes: object = node.attrs.get("axes")
    if len(node.inputs) > 1 and node.inputs[1].name:
        if not isinstance(node.inputs[1], gs.Constant):
            return None
        axes = node.inputs[1].values.tolist()
    if not axes:
        return [] if node.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    return [int(a) % rank for a in axes]  # type: ignore[attr-defined]


def _variance_statistics(ctx: RuleContext) -> dict[str, str]:
    """A decomposed normalization (mean of squares, then + eps, sqrt, reciprocal) is kept in float32."""
    reason = "variance statistics: a mean of squares" + (
        " overflows float16 once |x| > 256" if ctx.low.name == "fp16" else " loses precision in bfloat16"
    )
    out = {}
    for node in ctx.graph.nodes:
        if node.op not in ("ReduceMean", "ReduceSum") or not node.inputs[0].inputs:
            continue
        square = node.inputs[0].inputs[0]
        if not _is_square(square):
            continue
        out[square.name] = out[node.name] = reason
        last = node
        for follower in _chain(node, ("Add", "Sqrt", "Reciprocal", "Pow"), limit=3):
            out[follower.name] = reason
            last = follower
        # x * rsqrt(...) or x / sqrt(...): the normalized value, in float32 as LayerNormalization computes it (one
        # rounding, of the result, instead of three: x, 1/std and their product; in Llama's RMSNorm the search
        # found these Muls first)
        for consumer in last.outputs[0].outputs if last is not node else ():
            if consumer.op in ("Mul", "Div") and _reads(consumer, square.inputs[0]):
                out.setdefault(consumer.name, "normalization: x / std in float32, as LayerNormalization computes it")
    return out


def _reads(node: gs.Node, tensor: gs.Tensor) -> bool:
    return any(t is tensor for t in node.inputs)


def _residual_stream(ctx: RuleContext) -> dict[str, str]:
    """The Add that makes a normalization's input (through followers) stays float32: the residual stream.

    A normalization divides by the standard deviation, so it magnifies the absolute rounding of its input by
    1/std: a residual stream of small values (GPT-2's embeddings are ~0.02) rounded to float16 at every block comes
    out of the final LayerNorm a few float16 steps off, beyond the float16 tolerance. ``torch.autocast`` keeps that
    stream float32 too (LayerNorm returns float32 and the residual Add promotes). The MatMuls stay low.
    """
    reason = "residual stream: the normalization after it magnifies its rounding by 1/std"
    starts = [n.inputs[0] for n in ctx.graph.nodes if n.op in NORMALIZATIONS and n.inputs]
    starts += [
        n.inputs[0].inputs[0].inputs[0]
        for n in ctx.graph.nodes
        if n.op in ("ReduceMean", "ReduceSum") and n.inputs[0].inputs and _is_square(n.inputs[0].inputs[0])
    ]
    out = {}
    for tensor in starts:
        producer = _through_followers(tensor)
        if producer is not None and _is_centering(producer):  # x - mean(x) of a decomposed norm: look above it
            producer = _through_followers(producer.inputs[0])
        if producer is not None and producer.op == "Add" and ctx.float_tensors(producer):
            out[producer.name] = reason
    return out


def _is_centering(node: gs.Node) -> bool:
    """``x - ReduceMean(x)``: the first step of a decomposed normalization."""
    if node.op != "Sub" or len(node.inputs) != 2 or not node.inputs[1].inputs:
        return False
    mean = node.inputs[1].inputs[0]
    return mean.op in ("ReduceMean", "ReduceSum") and mean.inputs[0] is node.inputs[0]


def _through_followers(tensor: gs.Tensor, limit: int = 4) -> gs.Node | None:
    """The first node above ``tensor`` that is not a follower (Reshape, Transpose...), if any."""
    for _ in range(limit):
        if not tensor.inputs:
            return None
        node = tensor.inputs[0]
        if node.op not in FOLLOWER_OPS:
            return node
        tensor = node.inputs[0]
    return None


def _is_square(node: gs.Node) -> bool:
    if node.op == "Mul":
        return len(node.inputs) == 2 and node.inputs[0] is node.inputs[1]
    if node.op == "Pow" and isinstance(node.inputs[1], gs.Constant):
        return bool(np.all(node.inputs[1].values == 2))
    return False


def _chain(start: gs.Node, ops: tuple[str, ...], limit: int) -> Iterator[gs.Node]:
    node = start
    for _ in range(limit):
        consumers = [c for c in node.outputs[0].outputs if c.op in ops]
        if len(consumers) != 1:
            return
        node = consumers[0]
        yield node


def _shape_arithmetic(ctx: RuleContext) -> dict[str, str]:
    """Float math on tensor shapes (sizes, scales) needs exact integers: float16 has them only up to 2048."""
    derived = {t.name for n in ctx.graph.nodes if n.op in ("Shape", "Size") for t in n.outputs}
    out = {}
    for node in ctx.graph.nodes:
        variables = [t for t in node.inputs if t.name and not isinstance(t, gs.Constant)]
        if not variables or not all(t.name in derived for t in variables):
            continue
        derived.update(t.name for t in node.outputs)
        if ctx.float_tensors(node) and node.op != "Cast":  # casts follow their neighbours
            out[node.name] = "shape arithmetic: computes sizes from tensor shapes in float"
    return out


def _index_arithmetic(ctx: RuleContext) -> dict[str, str]:
    """A float result cast to an integer is an index: it needs float32's exact integers (to 2**24)."""
    out = {}
    for node in ctx.graph.nodes:
        if node.op == "Cast" and node.attrs.get("to") in _INTEGER_TYPES and node.inputs[0].inputs:
            source = node.inputs[0]
            if is_float32(source, ctx.inferred) and source.inputs[0].op not in FOLLOWER_OPS:
                out[source.inputs[0].name] = "index arithmetic: its float result is cast to an integer"
    return out


def _out_of_range_constants(ctx: RuleContext) -> dict[str, str]:
    """Constants beyond the half type's range (``finfo(float32).min`` as a mask value) and everything they flow into
    through adds, selects and reshapes stay float32, and so does the first node that reads them."""
    big = {name: value for name, value in _big_constants(ctx)}
    out = {}
    for node in ctx.graph.nodes:
        seen = [big[t.name] for t in node.inputs if t.name in big]
        if not seen:
            continue
        out[node.name] = (
            f"reads values up to {max(seen):.3g}, beyond {ctx.low.dtype_name}'s largest {ctx.low.max_finite:.4g}"
        )
        if node.op in PASSES_RANGE:
            big.update({t.name: max(seen) for t in node.outputs if is_float32(t, ctx.inferred)})
    return out


#: A constant of at most this many elements is a guard value (an epsilon), not a weight, when it vanishes.
GUARD_SIZE = 16


def _vanishing_constants(ctx: RuleContext) -> dict[str, str]:
    """A small constant the half type rounds to zero (``F.normalize``'s ``eps=1e-12``: float16's smallest value is
    6e-8) guards a division or a logarithm against zero: the node reading it stays float32, and so does the first
    node past it that reads its result through followers (``Clip(norm, eps) -> Expand -> Div``). In float16 the guard
    would be ``max(norm, 0)``, and a zero vector (a padded token's key) ``0 / 0``."""
    out: dict[str, str] = {}
    tensors = ctx.graph.tensors()
    for name, value in _vanishing(ctx):
        lost = f"{value:.3g}, which {ctx.low.dtype_name} rounds to 0"
        for reader in list(tensors[name].outputs):
            out.setdefault(reader.name, f"reads {lost}")
            for result in reader.outputs:
                for user in _past_followers(result):
                    out.setdefault(user.name, f"reads a value guarded by {lost}")
    return out


def _past_followers(tensor: gs.Tensor, limit: int = 4) -> Iterator[gs.Node]:
    """The nodes reading ``tensor``, looking through up to ``limit`` followers (reshapes, expands, casts)."""
    for node in list(tensor.outputs):
        if (node.op in FOLLOWER_OPS or node.op == "Cast") and limit > 0:
            for result in node.outputs:
                yield from _past_followers(result, limit - 1)
        else:
            yield node


def _vanishing(ctx: RuleContext) -> Iterator[tuple[str, float]]:
    for tensor, values in _float32_constants(ctx):
        if values.size > GUARD_SIZE:
            continue
        nonzero = values[np.isfinite(values) & (values != 0)]
        with np.errstate(over="ignore"):  # a large value becomes inf, not zero: not this rule's
            lost = nonzero[nonzero.astype(ctx.low.numpy_type).astype(np.float32) == 0]
        if lost.size:
            yield tensor, float(np.abs(lost).max())


def _float32_constants(ctx: RuleContext) -> Iterator[tuple[str, np.ndarray]]:
    """Every float32 constant's tensor name and values: initializers and Constant/ConstantOfShape outputs."""
    for tensor in ctx.graph.tensors().values():
        if isinstance(tensor, gs.Constant) and is_float32(tensor, ctx.inferred):
            yield tensor.name, constant_values(tensor)  # not kept on the graph: weights
    for node in ctx.graph.nodes:
        value = node.attrs.get("value")
        constant = node.op in ("Constant", "ConstantOfShape") and isinstance(value, gs.Constant) and node.outputs
        if constant and value.values.dtype == np.float32:
            yield node.outputs[0].name, value.values


def _big_constants(ctx: RuleContext) -> Iterator[tuple[str, float]]:
    for name, values in _float32_constants(ctx):
        yield from _big(name, values, ctx.low)


def _big(name: str, values: np.ndarray, low: LowType) -> Iterator[tuple[str, float]]:
    if values.size == 0:
        return
    finite = np.abs(values[np.isfinite(values)])
    peak = float(finite.max()) if finite.size else 0.0
    if peak > low.max_finite:
        yield name, peak


#: The scores a TopK picks among are followed back through these ops (and followers) to the projection making them.
SCORE_OPS = frozenset({"Softmax", "Sigmoid", "Add", "Sub", "Mul", "Div", "Cast", "Relu", "Softplus", "LogSoftmax"})

#: A projection making routing scores has at most this many outputs (the experts); a vocabulary's (an LM head whose
#: logits a TopK samples from) is far wider and stays low.
ROUTER_WIDTH = 1024


def _routing(ctx: RuleContext) -> dict[str, str]:
    """A mixture-of-experts router decides in float32: the TopK, the scores it picks among (softmax, sigmoid, bias,
    scale) and the narrow projection making them. A half type ties near scores and sends tokens to other experts
    (HunYuan's every-type case: 1.7x the float16 tolerance and a search of 33 builds); DeepSeek-V3 and vLLM compute
    their gates in float32 for the same reason. The projection costs hidden x experts: little."""
    reason = "routing: a half type ties near scores and the TopK picks other experts"
    out: dict[str, str] = {}
    for node in ctx.graph.nodes:
        if node.op != "TopK" or not ctx.float_tensors(node):
            continue
        out[node.name] = reason
        stack: list[gs.Tensor] = [node.inputs[0]]
        seen: set[str] = set()
        while stack and len(seen) < 16:
            tensor = stack.pop()
            if not tensor.inputs or tensor.name in seen:
                continue
            seen.add(tensor.name)
            producer = tensor.inputs[0]
            if producer.op in ("MatMul", "Gemm"):
                width = _projection_width(producer)
                if width is not None and width <= ROUTER_WIDTH:
                    out[producer.name] = reason
                continue
            if producer.op in SCORE_OPS or producer.op in FOLLOWER_OPS:
                if ctx.float_tensors(producer):
                    out[producer.name] = reason
                stack.extend(t for t in producer.inputs if not isinstance(t, gs.Constant))
    return out


def _projection_width(node: gs.Node) -> int | None:
    """The output width of a MatMul or Gemm with a constant weight (its last dimension), if it has one."""
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if not isinstance(weight, gs.Constant) or len(weight.shape) < 2:
        return None
    transposed = node.op == "Gemm" and bool(node.attrs.get("transB", 0))
    return int(weight.shape[-2] if transposed else weight.shape[-1])


ACCURACY_RULES: tuple[Callable[[RuleContext], dict[str, str]], ...] = (
    _per_node,
    _variance_statistics,
    _residual_stream,
    _out_of_range_constants,
    _vanishing_constants,
    _shape_arithmetic,
    _index_arithmetic,
    _routing,
)
