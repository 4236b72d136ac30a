"""Fewer casts: drop casts that change nothing, merge duplicates, cancel round trips, fold exact chains.

Only rewrites that keep every value bit for bit: a round trip is cancelled only when its first cast widens exactly
(float16 -> float32 -> float16 is the identity; float32 -> float16 -> float32 rounds, so it stays), and a chain
``A -> B -> C`` becomes ``A -> C`` only when ``A -> B`` is exact, or ``A`` is an integer type and ``C`` narrower
than ``B`` (int64 -> float32 -> float16: one rounding instead of two, different only beyond 2**24). A cast that
produces a graph output is kept, so output names never change. Dropping and cancelling or folding are rules
(:mod:`passes.rules`); merging duplicates needs the casts before it in the sweep, so it is a loop.
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import STANDARD_DOMAINS, PassResult
from passes.precision.types import dtype_of, infer
from passes.rewiring import redirect_consumers
from passes.rules import Facts, RewriteContext, RewriteRule, rewrite_nodes

T = onnx.TensorProto
_FLOATS = (T.FLOAT16, T.BFLOAT16, T.FLOAT, T.DOUBLE)
_INTEGERS = frozenset({T.INT8, T.UINT8, T.INT16, T.UINT16, T.INT32, T.UINT32, T.INT64, T.UINT64, T.BOOL})
#: (from, to) pairs that represent every value of ``from`` exactly.
_EXACT = frozenset(
    {(T.FLOAT16, T.FLOAT), (T.BFLOAT16, T.FLOAT), (T.FLOAT16, T.DOUBLE), (T.BFLOAT16, T.DOUBLE), (T.FLOAT, T.DOUBLE)}
    | {(small, f) for small in (T.BOOL, T.INT8, T.UINT8) for f in _FLOATS}
    | {(mid, f) for mid in (T.INT16, T.UINT16) for f in (T.FLOAT, T.DOUBLE)}
    | {(T.INT32, T.DOUBLE), (T.UINT32, T.DOUBLE)}
)


def is_exact(source: int | None, target: int | None) -> bool:
    """Does a cast from ``source`` to ``target`` (ONNX element types) keep every value exactly?"""
    return source == target or (source, target) in _EXACT


class SimplifyCasts:
    """Repeat the four cast rewrites until none applies: each is a sweep over the casts in graph order (no-op
    casts dropped, duplicates merged, round trips cancelled and exact chains folded), with the types inferred once
    per round."""

    name = "simplify_casts"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        changed = False
        for _ in range(8):
            facts = Facts(graph)
            facts.memo("cast_types", lambda: _Types(graph))
            step = rewrite_nodes((DropNoOpCast(),), _casts(graph), facts, settings, log_as=self.name) > 0
            step |= _merge_duplicates(graph)
            step |= rewrite_nodes((CancelOrFoldCasts(),), _casts(graph), facts, settings, log_as=self.name) > 0
            if not step:
                break
            graph.cleanup(remove_unused_graph_inputs=False)
            changed = True
        return PassResult(graph, changed)


class _Types:
    def __init__(self, graph: gs.Graph) -> None:
        self.inferred = infer(graph)
        self.outputs = {t.name for t in graph.outputs}

    def source(self, cast: gs.Node) -> int | None:
        return dtype_of(cast.inputs[0], self.inferred)


def _types(facts: Facts) -> _Types:
    return facts.memo("cast_types", lambda: _Types(facts.graph))


def _casts(graph: gs.Graph) -> list[gs.Node]:
    return [n for n in graph.nodes if n.op == "Cast" and n.domain in STANDARD_DOMAINS and n.outputs and n.inputs]


def _bypassable(cast: gs.Node, types: _Types) -> str | None:
    """Why consumers of ``cast``'s output cannot be moved (None: they can)."""
    if cast.outputs[0].name in types.outputs:
        return "its output is a graph output"
    if not cast.outputs[0].outputs:
        return "no node reads its output"
    return None


class DropNoOpCast(RewriteRule[gs.Tensor]):
    """A cast to the type its input already has: consumers read the input."""

    name = "drop_no_op_cast"
    ops = frozenset({"Cast"})

    def check(self, node: gs.Node, facts: Facts) -> gs.Tensor | str:
        """The cast's input, or why the cast stays."""
        types = _types(facts)
        source, to = types.source(node), node.attrs.get("to")
        if source != to:
            return f"casts {source} to {to}"
        return _bypassable(node, types) or node.inputs[0]

    def rewrite(self, plan: gs.Tensor, ctx: RewriteContext) -> gs.Tensor:
        """Consumers read the input."""
        return plan


class CancelOrFoldCasts(RewriteRule[tuple[gs.Tensor, bool]]):
    """``A -> B -> A`` with ``A -> B`` exact is the identity (consumers read the first cast's input); ``A -> B -> C``
    becomes one cast ``A -> C`` when ``A -> B`` is exact, or ``A`` an integer type and ``C`` narrower than ``B``."""

    name = "cancel_or_fold_casts"
    ops = frozenset({"Cast"})

    def check(self, node: gs.Node, facts: Facts) -> tuple[gs.Tensor, bool] | str:
        """(the first cast's input, whether the pair cancels), or why the cast stays."""
        types = _types(facts)
        producer = node.inputs[0].inputs[0] if node.inputs[0].inputs else None
        if producer is None or producer.op != "Cast" or producer.domain not in STANDARD_DOMAINS:
            return "its input is not computed by a Cast"
        origin, middle, target = types.source(producer), producer.attrs.get("to"), node.attrs.get("to")
        # int -> float32 -> float16 rounds once more than int -> float16, and only above 2**24: fold it.
        integer_to_float = origin in _INTEGERS and middle in _FLOATS and is_exact(target, middle)
        if origin is None or not (is_exact(origin, middle) or integer_to_float):
            return f"the first cast ({origin} to {middle}) rounds"
        if origin != target:
            return producer.inputs[0], False
        return _bypassable(node, types) or (producer.inputs[0], True)

    def rewrite(self, plan: tuple[gs.Tensor, bool], ctx: RewriteContext) -> gs.Tensor | None:
        """Cancelled: consumers read the first input; folded: this cast reads it (edited in place)."""
        source, cancels = plan
        if cancels:
            return source
        ctx.node.inputs[0] = source
        return None


def _merge_duplicates(graph: gs.Graph) -> bool:
    """Casts of one tensor to one type after the first: consumers read the first (not a rule: it needs the casts
    seen before it in the sweep)."""
    changed = False
    first: dict[tuple[str, int], gs.Node] = {}
    outputs = {t.name for t in graph.outputs}
    for cast in _casts(graph):
        key = (cast.inputs[0].name, int(cast.attrs.get("to", 0)))
        kept = first.setdefault(key, cast)
        if kept is not cast and cast.outputs[0].name not in outputs:
            changed |= redirect_consumers(cast.outputs[0], kept.outputs[0])
    return changed
