"""Precision as a graph rewrite: float32 tensors, weights and ops become float16 or bfloat16, except float32 islands.

TensorRT 10.12+ (strongly typed) and 11 build exactly the types the ONNX graph says, so this pass is where precision
is decided. Islands come from rules (:mod:`passes.precision.rules`), from the user (``settings.keep_fp32``: node
names, op types or PyTorch module paths) and from the pipeline (measured ranges, the accuracy search), each with its
reason. Ops that only move elements follow their input's type, so casts sit at island boundaries; graph inputs and
outputs keep their types (a cast at the boundary), or with ``settings.precision_io == "low"`` take the low type.
:mod:`passes.precision.casts` then removes casts that cancel.

>>> graph = ConvertPrecision()(graph, Settings(precision="fp16")).graph   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import PassResult
from passes.model_io.graphs import module_path
from passes.precision.cache_attention import write_out_cast_cache_attention
from passes.precision.casts import SimplifyCasts
from passes.precision.rewrite import Decision, rewrite
from passes.precision.rules import RuleContext, accuracy_islands, type_islands
from passes.precision.types import FLOAT, FOLLOWER_OPS, LOW_TYPES, LowType, infer, is_float32, onnx_opset
from passes.records import Island

logger = logging.getLogger(__name__)

__all__ = ["ConvertPrecision", "Island", "PrecisionPlan", "match_keep_fp32", "plan_precision"]

#: Nodes that read a float tensor in whatever type it has and never need a cast.
NEUTRAL_OPS = frozenset({"Shape", "Size", "IsNaN", "IsInf"})


@dataclass(frozen=True)
class PrecisionPlan:
    """Which node runs in which type, and why each float32 island is one."""

    low: LowType
    decisions: Mapping[str, Decision]  # node name -> "low" | "fp32" | "neutral", for nodes that touch float32
    islands: tuple[Island, ...]
    unmatched: tuple[str, ...]  # keep_fp32 entries that matched no node
    float32: frozenset[str]  # the tensors that were float32 when the plan was made

    @property
    def low_nodes(self) -> frozenset[str]:
        """The nodes the plan runs in the low type."""
        return frozenset(name for name, d in self.decisions.items() if d == "low")


def plan_precision(graph: gs.Graph, settings: Settings, extra: Sequence[Island] = ()) -> PrecisionPlan:
    """Decide every node's type. Puts ``graph`` in topological order; otherwise does not change it.

    Islands, first source wins: type rules (always), accuracy rules (unless ``settings.precision_rules`` is False),
    ``settings.keep_fp32``, then ``extra`` (measured, search): a measured island is one no rule foresaw.
    """
    low = LOW_TYPES[settings.precision]
    graph.toposort()
    inferred = infer(graph)
    ctx = RuleContext(graph, low, inferred, onnx_opset(graph), {d.name: d.max for d in settings.dynamic})
    nodes = {n.name: n for n in graph.nodes}
    found: dict[str, Island] = {}

    def add(name: str, source: str, reason: str) -> None:
        if name in nodes and name not in found and ctx.float_tensors(nodes[name]):
            node = nodes[name]
            found[name] = Island(name, node.op, source, reason, module_path(getattr(node, "metadata", {})))

    for name, reason in type_islands(ctx).items():
        add(name, "rule", reason)
    if settings.precision_rules:
        for name, reason in accuracy_islands(ctx).items():
            add(name, "rule", reason)
    user, unmatched = match_keep_fp32(graph.nodes, settings.keep_fp32)
    for name, entry in user.items():
        add(name, "user", f"keep_fp32 entry {entry!r}")
    for island in extra:
        add(island.node, island.source, island.reason)
    decisions = _decide(graph, ctx, set(found), low_io=settings.precision_io == "low")
    islands = tuple(i for i in found.values() if decisions.get(i.node) == "fp32")
    float32 = frozenset(t.name for t in graph.tensors().values() if t.name and is_float32(t, inferred))
    return PrecisionPlan(low, decisions, islands, unmatched, float32)


def match_keep_fp32(nodes: Iterable[gs.Node], entries: Sequence[str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """Nodes named by ``keep_fp32`` entries (node -> the entry), and the entries that matched nothing.

    ``"node:NAME"`` is a node name, ``"op:TYPE"`` an op type, ``"module:PATH"`` a PyTorch module path and every
    module inside it (``encoder.layer.3`` holds ``encoder.layer.3.attention.self``); an entry without a prefix is
    tried as all three.
    """
    matched: dict[str, str] = {}
    used: set[str] = set()
    for node in nodes:
        path = module_path(getattr(node, "metadata", {})) or ""
        for entry in entries:
            kind, _, value = (
                entry.partition(":") if entry.split(":", 1)[0] in ("node", "op", "module") else ("", "", entry)
            )
            if (
                (kind in ("", "node") and node.name == value)
                or (kind in ("", "op") and node.op == value)
                or (kind in ("", "module") and value and (path == value or path.startswith(value + ".")))
            ):
                matched.setdefault(node.name, entry)
                used.add(entry)
    return matched, tuple(e for e in entries if e not in used)


def _decide(graph: gs.Graph, ctx: RuleContext, islands: set[str], low_io: bool = False) -> dict[str, Decision]:
    """Compute nodes run low unless islands; followers take their data input's type (forward); nodes still open
    (constants, casts from integers, followers of those) take what most of their consumers want (backward).
    Graph inputs and outputs count as float32, or as the low type with ``low_io`` (``precision_io="low"``)."""
    boundary: Decision = "low" if low_io else "fp32"
    decisions: dict[str, Decision] = {}
    open_nodes = []
    for node in graph.nodes:
        if not ctx.float_tensors(node):
            continue
        kind = _kind(node, ctx)
        if node.name in islands:
            decisions[node.name] = "fp32"
        elif kind == "neutral":
            decisions[node.name] = "neutral"
        elif kind == "compute":
            decisions[node.name] = "low"
        else:
            source = _data_input(node, ctx)
            decision = _producer_decision(source, decisions, boundary) if source is not None else None
            if decision is None:
                open_nodes.append(node)
            else:
                decisions[node.name] = decision
    graph_outputs = {t.name for t in graph.outputs}
    for node in reversed(open_nodes):
        decisions[node.name] = _consumers_want(node, decisions, graph_outputs, boundary)
    _narrow_at_island_edges(graph, ctx, decisions, islands, graph_outputs if boundary == "fp32" else set())
    return decisions


def _narrow_at_island_edges(
    graph: gs.Graph, ctx: RuleContext, decisions: dict[str, Decision], islands: set[str], keep: set[str]
) -> None:
    """A float32 follower whose consumers all run low runs low too (backward, so whole chains do): the narrowing
    cast sits at the float32 island's edge instead of after the followers. Exact: followers only move, select or
    compare elements, and rounding to the low type commutes with that. ``keep`` names float32 graph outputs.

    Why it matters: TensorRT-RTX 1.7's Myelin attention fusion recognises ``Softmax -> Where(IsNaN(p), 0, p) ->
    MatMul`` (the NaN guard torch's scaled_dot_product_attention exports) and fails to build (``mha_fusion.cpp:3156:
    CHECK(is_softmax(op->operands()[0]->tensor()->producer())) failed``) when a Cast sits between that float32 guard
    and the float16 MatMul: the Softmax is a float32 island (it reads the float32 mask), the guard followed it, and
    the cast came after the guard. Bisected on GPT-2 and Llama graphs: the same graph builds with the Cast between
    Softmax and the guard (guard in float16), with no guard, with the guard replaced by Relu/Identity/Mul, with the
    second MatMul in float32, or with Softmax in float16; only ``guard(float32) -> Cast -> MatMul(float16)`` fails.
    """
    for node in reversed(graph.nodes):
        if decisions.get(node.name) != "fp32" or node.name in islands or _kind(node, ctx) != "follower":
            continue
        if any(t.name in keep for t in node.outputs):
            continue
        votes = [decisions.get(c.name) for t in node.outputs for c in t.outputs]
        votes = [v for v in votes if v != "neutral"]
        if votes and all(v == "low" for v in votes):
            decisions[node.name] = "low"


def _kind(node: gs.Node, ctx: RuleContext) -> str:
    if node.op in NEUTRAL_OPS or (node.op == "Cast" and node.attrs.get("to") != FLOAT):
        return "neutral"
    if node.op in FOLLOWER_OPS or node.op == "Cast":
        return "follower"
    if not any(is_float32(t, ctx.inferred) for t in node.inputs if t.name):
        return "source"  # Constant, ConstantOfShape, EyeLike: float32 out of nothing
    return "compute"


def _data_input(node: gs.Node, ctx: RuleContext) -> gs.Tensor | None:
    for tensor in node.inputs:
        if tensor.name and not isinstance(tensor, gs.Constant) and is_float32(tensor, ctx.inferred):
            return tensor
    return None


def _producer_decision(tensor: gs.Tensor, decisions: Mapping[str, Decision], boundary: Decision) -> Decision | None:
    if not tensor.inputs:
        return boundary  # a graph input: float32, or the low type with precision_io="low"
    decision = decisions.get(tensor.inputs[0].name)
    return None if decision in (None, "neutral") else decision


def _consumers_want(
    node: gs.Node, decisions: Mapping[str, Decision], graph_outputs: set[str], boundary: Decision
) -> Decision:
    votes = {"low": 0, "fp32": 0}
    for tensor in node.outputs:
        votes[boundary] += tensor.name in graph_outputs
        for consumer in tensor.outputs:
            decision = decisions.get(consumer.name)
            if decision in votes:
                votes[decision] += 1
    return "low" if votes["low"] > votes["fp32"] else "fp32"


class ConvertPrecision:
    """The precision pass. A no-op when ``settings.precision == "fp32"`` and on a graph it already converted.

    ``islands`` are extra float32 islands with their source and reason (the pipeline's measured and searched
    ones); :meth:`with_islands` returns a copy with more.
    """

    name = "precision"

    def __init__(self, islands: Sequence[Island] = ()) -> None:
        self.islands = tuple(islands)

    def with_islands(self, islands: Sequence[Island]) -> ConvertPrecision:
        """This pass with more float32 islands (measured or searched ones)."""
        return ConvertPrecision((*self.islands, *islands))

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        if settings.precision == "fp32" or vars(graph).get("precision_converted"):
            return PassResult(graph, False)
        plan = plan_precision(graph, settings, self.islands)
        for entry in plan.unmatched:
            logger.warning("keep_fp32 entry %r matched no node (node names, op types, module paths)", entry)
        rewrite(graph, plan.decisions, plan.low, plan.float32, low_io=settings.precision_io == "low")
        SimplifyCasts()(graph, settings)
        # after the casts are final: a float32 attention island over a half-type KV cache crashes TensorRT-RTX
        write_out_cast_cache_attention()(graph, settings)
        graph.precision_converted = plan.low.name  # the pass manager repeats the list: convert once
        logger.info(
            "precision %s: %d of %d float nodes in %s, %d float32 islands",
            plan.low.name,
            len(plan.low_nodes),
            len(plan.decisions),
            plan.low.dtype_name,
            len(plan.islands),
        )
        return PassResult(graph, True)
