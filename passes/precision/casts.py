"""Fewer casts: drop casts that change nothing, merge duplicates, cancel round trips, fold exact chains.

Only rewrites that keep every value bit for bit: a round trip is cancelled only when its first cast widens exactly
(float16 -> float32 -> float16 is the identity; float32 -> float16 -> float32 rounds, so it stays), and a chain
``A -> B -> C`` becomes ``A -> C`` only when ``A -> B`` is exact, or ``A`` is an integer type and ``C`` narrower
than ``B`` (int64 -> float32 -> float16: one rounding instead of two, different only beyond 2**24). A cast that
produces a graph output is kept, so output names never change.
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from converters.settings import Settings
from passes.base import STANDARD_DOMAINS, PassResult
from passes.precision.types import dtype_of, infer

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
    return source == target or (source, target) in _EXACT


class SimplifyCasts:
    """Repeat the four cast rewrites until none applies."""

    name = "simplify_casts"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        changed = False
        for _ in range(8):
            types = _Types(graph)
            step = _drop_no_ops(graph, types) | _merge_duplicates(graph) | _cancel_and_fold(graph, types)
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


def _casts(graph: gs.Graph) -> list[gs.Node]:
    return [n for n in graph.nodes if n.op == "Cast" and n.domain in STANDARD_DOMAINS and n.outputs and n.inputs]


def _bypass(cast: gs.Node, replacement: gs.Tensor) -> bool:
    """Point every consumer of ``cast``'s output at ``replacement``; False if there was nothing to move."""
    moved = False
    for consumer in list(cast.outputs[0].outputs):
        for index, tensor in enumerate(consumer.inputs):
            if tensor is cast.outputs[0]:
                consumer.inputs[index] = replacement
                moved = True
    return moved


def _drop_no_ops(graph: gs.Graph, types: _Types) -> bool:
    changed = False
    for cast in _casts(graph):
        if cast.outputs[0].name not in types.outputs and types.source(cast) == cast.attrs.get("to"):
            changed |= _bypass(cast, cast.inputs[0])
    return changed


def _merge_duplicates(graph: gs.Graph) -> bool:
    changed = False
    first: dict[tuple[str, int], gs.Node] = {}
    outputs = {t.name for t in graph.outputs}
    for cast in _casts(graph):
        key = (cast.inputs[0].name, int(cast.attrs.get("to", 0)))
        kept = first.setdefault(key, cast)
        if kept is not cast and cast.outputs[0].name not in outputs:
            changed |= _bypass(cast, kept.outputs[0])
    return changed


def _cancel_and_fold(graph: gs.Graph, types: _Types) -> bool:
    changed = False
    for second in _casts(graph):
        producer = second.inputs[0].inputs[0] if second.inputs[0].inputs else None
        if producer is None or producer.op != "Cast" or producer.domain not in STANDARD_DOMAINS:
            continue
        origin, middle, target = types.source(producer), producer.attrs.get("to"), second.attrs.get("to")
        # int -> float32 -> float16 rounds once more than int -> float16, and only above 2**24: fold it.
        integer_to_float = origin in _INTEGERS and middle in _FLOATS and is_exact(target, middle)
        if origin is None or not (is_exact(origin, middle) or integer_to_float):
            continue
        if origin == target and second.outputs[0].name not in types.outputs:
            changed |= _bypass(second, producer.inputs[0])  # A -> B -> A with A -> B exact: the identity
        elif origin != target:
            second.inputs[0] = producer.inputs[0]  # A -> B -> C: one cast A -> C
            changed = True
    return changed
