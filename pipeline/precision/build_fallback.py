"""When TensorRT-RTX builds the float32 graph but not the low-precision one: find the nodes whose float16 (bfloat16)
form breaks the build, keep them in float32 and build again.

The builder gate (:class:`pipeline.precision.buildable.BuilderGate`) finds the failure for the whole graph; the
builder's message seldom names a node (Myelin's ``formats.cpp:3118: CHECK(def_tactic_desc) failed`` does not).
The search keeps candidate nodes in float32 as islands (source ``"build"``, the mechanism of ``keep_fp32`` and of
the measured islands) and asks the gate again, cheapest first:

1. the low-precision nodes the message names (a parser error names its node; a builder error may name a layer,
   which the parser names after its node), if it names any: one build;
2. otherwise the culprits one at a time, by bisection over the low-precision compute nodes in topological order:
   the shortest prefix that, kept in float32 beside the culprits found so far, builds ends with the next culprit
   (:func:`pipeline.precision.search.shortest_passing_prefix`); the next one is searched before it, until the
   culprits alone build. About ``log2(n) + 1`` builds per culprit; each set is built once.

Builds are capped (:data:`MAX_BUILDS`): a search that does not finish within the cap, or a graph that does not build
even with every candidate in float32, is the ConversionError the gate raised before, naming what was tried.

A graph the builder builds costs one build here and no search (a conversion that needs no fallback pays nothing
more). Found on transformers' MobileViTV2 in float16 (TensorRT-RTX 1.7.1): see
``tests/pipeline/precision/test_build_fallback.py``.

>>> fallback = build_fallback(candidates.build, gate, fp32_model, settings, islands, final)  # doctest: +SKIP
>>> fallback.islands if fallback else ()  # doctest: +SKIP
(Island(node=..., source="build", reason="TensorRT-RTX does not build it in float16: ..."),)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

from converters.errors import ConversionError
from passes import to_graph
from passes.precision.convert import plan_precision
from passes.precision.types import FOLLOWER_OPS, LOW_TYPES
from passes.records import Island, PassRecord
from pipeline.precision.buildable import BuilderGate
from pipeline.precision.search import shortest_passing_prefix
from pipeline.progress import quiet_info
from pipeline.settings import Settings

logger = logging.getLogger(__name__)

#: Most gate builds the search makes (each costs seconds on a large graph): about three culprits among 1,000 nodes.
MAX_BUILDS = 32
#: The builder's message in each island's reason is cut to this many characters (the report's note has it whole).
SHORT_MESSAGE = 160

Build = Callable[[Sequence[Island]], tuple[onnx.ModelProto, list[PassRecord]]]


@dataclass(frozen=True)
class BuildFallback:
    """The nodes kept in float32 so that TensorRT-RTX builds the graph, and that graph."""

    islands: tuple[Island, ...]
    model: onnx.ModelProto
    records: list[PassRecord]
    builds: int  # TensorRT-RTX builds it took: the failing graph's and the float32 graph's included
    message: str  # the builder's message on the graph without these islands
    dtype: str  # the low type: "float16" or "bfloat16"

    @property
    def note(self) -> str:
        """The report's line: the nodes, why and what it took."""
        names = ", ".join(i.node for i in self.islands)
        return (
            f"kept in float32 because TensorRT-RTX does not build them in {self.dtype}: {names} ({self.builds} "
            f"builds to find them); the builder's message on the {self.dtype} graph: {_clean(self.message)}"
        )


class _OutOfBuilds(Exception):
    """The search reached :data:`MAX_BUILDS`."""


def build_fallback(
    build: Build,
    gate: BuilderGate,
    fp32_model: onnx.ModelProto,
    settings: Settings,
    islands: Sequence[Island],
    model: onnx.ModelProto,
    max_builds: int | None = None,
) -> BuildFallback | None:
    """None when the gate builds ``model`` (or is off); else the islands that make it build, beside ``islands``.

    ``build`` makes the low-precision graph for a list of extra islands (``islands`` and the searched ones), as
    the precision stage does for every candidate. Raises ConversionError when no set is found within ``max_builds``
    (:data:`MAX_BUILDS` unless given).
    """
    builds_before = gate.builds
    message = gate.rejects(model)
    if message is None:
        return None
    dtype = LOW_TYPES[settings.precision].dtype_name
    ops = {n.name: n.op_type for n in fp32_model.graph.node}
    graph = to_graph(fp32_model)[0]
    plan = plan_precision(graph, settings, islands)  # puts the graph in topological order
    order = [node.name for node in graph.nodes if node.name in plan.low_nodes]
    named = _named_in(message, order)
    movable = [name for name in order if ops[name] not in FOLLOWER_OPS | {"Cast", "Constant"}]
    logger.info(
        "precision: TensorRT-RTX does not build the %s graph (%s); searching the nodes to keep in float32 among %d",
        dtype,
        _short(message),
        len(movable),
    )
    cap = MAX_BUILDS if max_builds is None else max_builds
    search = _Search(build, gate, islands, ops, dtype, message, cap)
    with quiet_info(logging.getLogger("passes.precision.convert")):  # one pass summary per try otherwise
        try:
            found = search.named(named) or search.culprits(movable)
        except _OutOfBuilds:
            found = None
    if found is None:
        raise ConversionError(
            f"TensorRT-RTX builds the float32 graph but not the {dtype} graph: {message}; keeping nodes in float32 "
            f"did not help: {search.tried(named, movable)}",
            fix="keep the nodes the error names in float32 (keep_fp32=[...]) or convert with precision='fp32', and "
            "report the model: the precision rewrite should not emit a graph the builder rejects",
        )
    kept, built, records = found
    fallback = BuildFallback(tuple(kept), built, records, gate.builds - builds_before, message, dtype)
    logger.info("precision: %s", fallback.note)
    return fallback


class _Search:
    """Builds candidate island sets through the gate, each set once, at most ``cap`` times."""

    def __init__(
        self,
        build: Build,
        gate: BuilderGate,
        islands: Sequence[Island],
        ops: dict[str, str],
        dtype: str,
        message: str,
        cap: int,
    ) -> None:
        self.build, self.gate, self.islands, self.ops, self.dtype, self.cap = build, gate, islands, ops, dtype, cap
        self.reason = f"TensorRT-RTX does not build it in {dtype}: {_short(message)}"
        self.builds = 0
        self.built: dict[frozenset[str], tuple[onnx.ModelProto, list[PassRecord]] | None] = {}

    def island(self, name: str) -> Island:
        return Island(name, self.ops[name], "build", self.reason)

    def attempt(self, names: Sequence[str]) -> tuple[onnx.ModelProto, list[PassRecord]] | None:
        """The graph with ``names`` in float32 and its records when the builder builds it, else None."""
        key = frozenset(names)
        if key not in self.built:
            if self.builds >= self.cap:
                raise _OutOfBuilds
            self.builds += 1
            model, records = self.build([*self.islands, *(self.island(n) for n in names)])
            message = self.gate.rejects(model)
            logger.debug("build fallback: %d nodes in float32: %s", len(names), message or "builds")
            self.built[key] = None if message is not None else (model, records)
        return self.built[key]

    def named(self, names: Sequence[str]) -> tuple[list[Island], onnx.ModelProto, list[PassRecord]] | None:
        """The nodes the builder's message names, when keeping them in float32 is enough."""
        result = self.attempt(names) if names else None
        return None if result is None else ([self.island(n) for n in names], *result)

    def culprits(self, order: Sequence[str]) -> tuple[list[Island], onnx.ModelProto, list[PassRecord]] | None:
        """Culprits one at a time, each the last node of the shortest prefix of ``order`` that builds beside those
        found so far (found last to first); None when all of ``order`` in float32 does not build."""
        kept: list[str] = []
        upper = len(order)  # the next culprit is in order[:upper]: the prefix up to the last one built
        while True:

            def builds(k: int, found: list[str] = kept) -> bool:  # this round's culprits: kept changes each round
                return self.attempt([*found, *order[:k]]) is not None

            k = shortest_passing_prefix(upper, builds, f"precision: nodes TensorRT-RTX rejects in {self.dtype}")
            if k is None:
                return None
            kept = [order[k - 1], *kept]
            upper = k - 1
            result = self.attempt(kept)
            if result is not None:
                return [self.island(n) for n in kept], *result
            if upper == 0:  # not monotonic: the culprits alone do not build, though with their prefix they did
                return None

    def tried(self, named: Sequence[str], order: Sequence[str]) -> str:
        """What the search tried, for the error."""
        parts = []
        if named:
            parts.append(f"the {len(named)} nodes the message names ({', '.join(named[:8])}) do not build")
        everything = self.built.get(frozenset(order), ())
        if everything is None:
            parts.append(f"the graph with all {len(order)} low-precision compute nodes in float32 does not build")
        elif self.builds >= self.cap:
            parts.append(f"no set of nodes found within {self.cap} builds")
        else:
            parts.append("the nodes bisection found do not build without the nodes before them")
        return f"{'; '.join(parts)} ({self.builds} builds)"


def _named_in(message: str, names: Sequence[str]) -> list[str]:
    """The nodes of ``names`` that ``message`` names as a whole word (not as part of a longer name)."""
    return [n for n in names if re.search(rf"(?<![\w/]){re.escape(n)}(?![\w/])", message)]


def _short(message: str) -> str:
    text = _clean(message)
    return text if len(text) <= SHORT_MESSAGE else text[: SHORT_MESSAGE - 3] + "..."


def _clean(message: str) -> str:
    """The builder's message without its boilerplate (the API call, error code, Myelin's wrapper and source path):
    ``build: Myelin (MyelinCheckException: formats.cpp:3118: CHECK(def_tactic_desc) failed.)``."""
    text = " ".join(message.split())
    for boilerplate in (
        r"IBuilder::buildSerializedNetwork: Error Code \d+: ",
        r"\[[\w.]+:\d+: \w+\] ",
        r" In \w+ at /[^\s)]+",
    ):
        text = re.sub(boilerplate, "", text)
    return text
