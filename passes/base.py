"""Pass API and pass manager.

A pass takes a graph-surgeon graph and the settings and returns ``PassResult(graph, modified)``. Pass lists are
explicit ordered tuples. The manager times every pass, records node counts before and after, can repeat a list
until nothing changes (bounded), and re-raises an exception inside a pass naming the pass and the passes that
ran before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import onnx_graphsurgeon as gs

from converters.errors import ConversionError, PipelineError
from converters.settings import Settings
from passes.model_io.gc_pause import gc_paused
from passes.records import PassRecord

logger = logging.getLogger(__name__)

#: The domains of ONNX's own operators, as graph-surgeon reports them (None: the field is unset).
STANDARD_DOMAINS = frozenset({"", "ai.onnx", None})


@dataclass(frozen=True)
class PassResult:
    """What a pass returns. ``settled``: running the pass again on ``graph`` would not modify it (the pass reached a
    fixed point), so the manager need not run it again until another pass modifies the graph."""

    graph: gs.Graph
    modified: bool
    settled: bool = False


@runtime_checkable
class GraphPass(Protocol):
    """What the pass manager runs. A plain function with a ``name`` attribute works too."""

    name: str

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult: ...


class PassManager:
    """Runs an ordered tuple of passes, repeating it until no pass modifies the graph.

    A pass is not run again on a graph it left unmodified, or modified and ``settled``, that no other pass has
    modified since: a pass is a function of the graph and the settings, so it would leave it unmodified (the passes
    after the last change of an iteration are skipped on the next, and have no record there).

    >>> manager = PassManager(default_passes())          # doctest: +SKIP
    >>> graph, records = manager.run(graph, Settings())  # doctest: +SKIP
    """

    def __init__(
        self,
        passes: Sequence[GraphPass],
        *,
        max_iterations: int = 1,
        observer: Callable[[PassRecord, gs.Graph], None] | None = None,
    ) -> None:
        names = [p.name for p in passes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConversionError(
                f"pass list names {', '.join(duplicates)} more than once",
                fix="give every pass in a list a distinct name",
            )
        if max_iterations < 1:
            raise ConversionError("max_iterations must be at least 1", fix="pass max_iterations=1 or more")
        self.passes = tuple(passes)
        self.max_iterations = max_iterations
        self.observer = observer  # called after every pass that modified the graph (the debug mode's hook)

    @gc_paused()  # see passes.model_io.gc_pause: the collector walks every node again and again, freeing nothing
    def run(self, graph: gs.Graph, settings: Settings) -> tuple[gs.Graph, list[PassRecord]]:
        """Run the passes in order, repeated until a round changes nothing (at most ``max_iterations`` rounds);
        return the graph and one record per pass run."""
        records: list[PassRecord] = []
        settled: set[int] = set()  # passes that left the graph as it is now
        for iteration in range(self.max_iterations):
            changed = False
            for index, graph_pass in enumerate(self.passes):
                if index in settled:
                    continue
                result, record = self._run_one(graph_pass, graph, settings, iteration, records)
                graph = result.graph
                records.append(record)
                changed |= record.modified
                if record.modified:
                    settled = {index} if result.settled else set()
                    if self.observer is not None:
                        self.observer(record, graph)
                else:
                    settled.add(index)
            if not changed:
                break
        else:
            if self.max_iterations > 1:
                logger.warning(
                    "pass list still modified the graph after %d iterations; stopping there", self.max_iterations
                )
        return graph, records

    @staticmethod
    def _run_one(
        graph_pass: GraphPass, graph: gs.Graph, settings: Settings, iteration: int, before: list[PassRecord]
    ) -> tuple[PassResult, PassRecord]:
        nodes_before = len(graph.nodes)
        start = time.perf_counter()
        try:
            result = graph_pass(graph, settings)
        except PipelineError:
            raise
        except Exception as exc:
            ran = ", ".join(dict.fromkeys(r.name for r in before)) or "none"
            raise ConversionError(
                f"pass {graph_pass.name!r} failed: {type(exc).__name__}: {exc}; passes run before it: {ran}",
                fix=f"run without {graph_pass.name!r} (pass a pass list without it) to confirm, and report the "
                "graph that triggers it",
            ) from exc
        if not isinstance(result, PassResult):
            raise ConversionError(
                f"pass {graph_pass.name!r} returned {type(result).__name__}, not PassResult",
                fix="return PassResult(graph, modified) from the pass",
            )
        seconds = time.perf_counter() - start
        record = PassRecord(graph_pass.name, iteration, seconds, nodes_before, len(result.graph.nodes), result.modified)
        logger.debug("pass %s: %d -> %d nodes in %.3f s", record.name, nodes_before, record.nodes_after, seconds)
        return result, record


Placement = tuple[str, str, GraphPass]


def insert_passes(passes: Sequence[GraphPass], extra: Sequence[Placement]) -> tuple[GraphPass, ...]:
    """``passes`` with user passes placed at named points: ``("after", "fold_constants", MyPass())``.

    >>> insert_passes(default_passes(), [("before", "toposort", MyPass())])   # doctest: +SKIP
    """
    result = list(passes)
    for where, anchor, graph_pass in extra:
        names = [p.name for p in result]
        if where not in ("before", "after") or anchor not in names:
            raise ConversionError(
                f"cannot place pass {getattr(graph_pass, 'name', graph_pass)!r} {where!r} {anchor!r}",
                fix=f"use ('before' | 'after', <pass name>, pass) with a pass name from: {', '.join(names)}",
            )
        index = names.index(anchor) + (1 if where == "after" else 0)
        result.insert(index, graph_pass)
    return tuple(result)
