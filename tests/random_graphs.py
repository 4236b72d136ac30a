"""Random ONNX graphs for property-based tests of the passes (hypothesis strategies; importable as ``random_graphs``).

A graph is built op by op from one or two float32 inputs. Every op is chosen among those whose shape rules the
current tensor satisfies, so the graph is valid by construction: elementwise ops with broadcasting constants (among
them the identity elements 0 and 1 that the passes remove), MatMul/Gemm/Conv with constant weights, Reshape/
Transpose/Unsqueeze/Squeeze chains, reductions with axes as inputs or attributes, Concat/Split/Slice, constant-only
subgraphs (for folding), Identity nodes, dead branches and several graph outputs. Values stay in a range where float32
arithmetic is well conditioned (Tanh before Exp, divisors away from zero), so "the same outputs" can be exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

OPSET = 20
Shape = tuple[int, ...]


@dataclass
class GraphBuilder:
    """The graph under construction: nodes, constants, and the static shape of every tensor made so far."""

    draw: st.DrawFn
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    shapes: dict[str, Shape] = field(default_factory=dict)
    count: int = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, array: np.ndarray, as_node: bool = False) -> str:
        """A constant as an initializer, or as a Constant node (both forms reach the passes from exporters)."""
        name = self.name("c")
        if as_node:
            self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name)))
        else:
            self.initializers.append(numpy_helper.from_array(array, name))
        self.shapes[name] = tuple(array.shape)
        return name

    def node(self, op: str, inputs: list[str], shape: Shape, **attrs: object) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(f"n_{op}"), **attrs))
        self.shapes[out] = shape
        return out

    def floats(self, shape: Shape, low: float = -1.0, high: float = 1.0) -> np.ndarray:
        seed = self.draw(st.integers(0, 2**31 - 1))
        return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def _broadcast_shape(b: GraphBuilder, shape: Shape) -> Shape:
    """A shape that broadcasts to ``shape`` without changing it: a suffix of it, with some dims set to 1."""
    start = b.draw(st.integers(0, len(shape)))
    return tuple(1 if b.draw(st.booleans()) else d for d in shape[start:])


def unary(b: GraphBuilder, x: str) -> str:
    op = b.draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Identity", "Softplus"]))
    return b.node(op, [x], b.shapes[x])


def exp_of_bounded(b: GraphBuilder, x: str) -> str:
    return b.node("Exp", [b.node("Tanh", [x], b.shapes[x])], b.shapes[x])


def binary(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    op = b.draw(st.sampled_from(["Add", "Sub", "Mul", "Div", "Max", "Min"]))
    kind = b.draw(st.sampled_from(["random", "identity", "tensor", "folded"]))
    other_shape = _broadcast_shape(b, shape)
    if kind == "identity":  # x + 0, x - 0, x * 1, x / 1: what RemoveIdentityElements takes out
        value = 0.0 if op in ("Add", "Sub") else 1.0
        other = b.const(np.full(other_shape, value, np.float32), as_node=b.draw(st.booleans()))
    elif kind == "tensor":
        other = x
    elif kind == "folded":  # a constant-only subgraph: FoldConstants turns it into one initializer
        left = b.const(b.floats(other_shape, 0.5, 1.5))
        other = b.node("Add", [left, b.const(b.floats(other_shape, 0.5, 1.5))], other_shape)
    else:
        low = 0.5 if op == "Div" else -1.0
        other = b.const(b.floats(other_shape, low, 1.5))
    if op == "Div" and kind == "tensor":
        other = b.node("Add", [b.node("Abs", [x], shape), b.const(np.ones((1,), np.float32))], shape)
    inputs = [other, x] if b.draw(st.booleans()) and op in ("Add", "Mul", "Max", "Min") else [x, other]
    return b.node(op, inputs, shape)


def matmul(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    k = b.draw(st.integers(1, 6))
    weight = b.const(b.floats((shape[-1], k), -0.5, 0.5))
    return b.node("MatMul", [x, weight], (*shape[:-1], k))


def gemm(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    if len(shape) != 2:
        x = flatten(b, x)
        shape = b.shapes[x]
    n = b.draw(st.integers(1, 6))
    trans_b = b.draw(st.integers(0, 1))
    w_shape = (n, shape[1]) if trans_b else (shape[1], n)
    inputs = [x, b.const(b.floats(w_shape, -0.5, 0.5))]
    if b.draw(st.booleans()):
        inputs.append(b.const(b.floats((n,))))
    return b.node("Gemm", inputs, (shape[0], n), transB=trans_b, alpha=1.0, beta=1.0)


def conv(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    if len(shape) != 4:
        return unary(b, x)
    k = b.draw(st.sampled_from([1, 3]))
    out_channels = b.draw(st.integers(1, 4))
    weight = b.const(b.floats((out_channels, shape[1], k, k), -0.5, 0.5))
    pad = k // 2
    inputs = [x, weight] + ([b.const(b.floats((out_channels,)))] if b.draw(st.booleans()) else [])
    return b.node("Conv", inputs, (shape[0], out_channels, shape[2], shape[3]), pads=[pad] * 4, kernel_shape=[k, k])


def flatten(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    rest = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    target = b.const(np.array([shape[0], -1], np.int64))
    return b.node("Reshape", [x, target], (shape[0], rest))


def transpose(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    perm = b.draw(st.permutations(range(len(shape))))
    return b.node("Transpose", [x], tuple(shape[p] for p in perm), perm=list(perm))


def squeeze_chain(b: GraphBuilder, x: str) -> str:
    """Unsqueeze then Squeeze (with axes as an input, or Squeeze without axes): what the squeeze passes merge."""
    shape = b.shapes[x]
    if len(shape) >= 5:
        return unary(b, x)
    axis = b.draw(st.integers(0, len(shape)))
    wider = (*shape[:axis], 1, *shape[axis:])
    up = b.node("Unsqueeze", [x, b.const(np.array([axis], np.int64))], wider)
    if b.draw(st.booleans()) and 1 not in shape:
        return b.node("Squeeze", [up], shape)  # axes-less: every 1 goes, which is only the one we added
    return b.node("Squeeze", [up, b.const(np.array([axis], np.int64))], shape)


def reduce(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    op = b.draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]))
    axes = sorted(b.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape))))
    keep = b.draw(st.integers(0, 1))
    out = tuple((1 if keep else None) if i in axes else d for i, d in enumerate(shape))
    out_shape = tuple(d for d in out if d is not None)
    if not out_shape:  # keep rank >= 1: a 0-d tensor is its own corner (the op-coverage suite takes it)
        keep, out_shape = 1, tuple(1 for _ in shape)
    axes_input = b.const(np.array(axes, np.int64), as_node=b.draw(st.booleans()))
    return b.node(op, [x, axes_input], out_shape, keepdims=keep)


def concat_split(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    axis = b.draw(st.integers(0, len(shape) - 1))
    other = unary(b, x)
    joined = (*shape[:axis], 2 * shape[axis], *shape[axis + 1 :])
    cat = b.node("Concat", [x, other], joined, axis=axis)
    if not b.draw(st.booleans()):
        return cat
    first, second = b.name("split"), b.name("split")
    sizes = b.const(np.array([shape[axis], shape[axis]], np.int64))
    b.nodes.append(helper.make_node("Split", [cat, sizes], [first, second], name=b.name("n_Split"), axis=axis))
    b.shapes[first] = b.shapes[second] = shape
    return b.node("Sub", [first, second], shape)


def slice_(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    axis = b.draw(st.integers(0, len(shape) - 1))
    start = b.draw(st.integers(0, shape[axis] - 1))
    end = b.draw(st.integers(start + 1, shape[axis]))
    inputs = [x, *(b.const(np.array([v], np.int64)) for v in (start, end, axis))]
    return b.node("Slice", inputs, (*shape[:axis], end - start, *shape[axis + 1 :]))


OPS = (
    unary,
    exp_of_bounded,
    binary,
    matmul,
    gemm,
    conv,
    flatten,
    transpose,
    squeeze_chain,
    reduce,
    concat_split,
    slice_,
)


@st.composite
def random_graph(draw: st.DrawFn, max_ops: int = 12) -> onnx.ModelProto:
    """One random, valid float32 ONNX model (see the module doc)."""
    b = GraphBuilder(draw)
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    inputs = ["x"] + (["y"] if draw(st.booleans()) else [])
    for name in inputs:
        b.shapes[name] = shape
    live = list(inputs)
    for _ in range(draw(st.integers(1, max_ops))):
        x = draw(st.sampled_from(live))
        if draw(st.integers(0, 9)) == 0 and len(live) > 1:  # join two branches of equal shape
            y = draw(st.sampled_from(live))
            if b.shapes[x] == b.shapes[y]:
                live.append(b.node("Add", [x, y], b.shapes[x]))
                continue
        live.append(draw(st.sampled_from(OPS))(b, x))
    candidates = [t for t in live if t not in inputs] or [b.node("Identity", ["x"], shape)]
    outputs = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3, unique=True))
    # live tensors that are not outputs are dead branches: RemoveDeadNodes takes them out
    graph = helper.make_graph(
        b.nodes,
        "random",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(b.shapes[o])) for o in outputs],
        b.initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)


def feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for ``model``'s float32 inputs."""
    rng = np.random.default_rng(seed)
    out = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        out[value.name] = rng.uniform(-2, 2, size=shape).astype(np.float32)
    return out
