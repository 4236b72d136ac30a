"""Accuracy-driven search for float32 islands: rank nodes by how much error each adds, then bisect.

Ranking takes one observed run of the float32 graph and one of the low-precision graph: a node's sensitivity is
the relative error of its output minus the largest relative error among its inputs (what the node itself adds;
an output that turns inf or NaN where float32 is finite ranks first). Bisection then finds the shortest head of
that ranking which, kept in float32, meets the tolerance: about log2(n) builds instead of n; pruning then puts back
in the low type the nodes of that head the target does not need (:data:`MAX_PRUNE` tries at most).

Each candidate is a build of the whole graph and a run of it on the calibration inputs (on Florence-2's 90M-weight
encoder graph 25 s here), so the search stops early when it cannot give what the low type is asked for
(:func:`search_islands`): a graph whose most error-adding half of the ranked nodes, kept in float32, still misses the
tolerance has its error spread over the graph, not added by a few nodes, and whatever the search found there would
keep most of the graph in float32; it keeps all the ranked nodes in float32 but the MatMul/Gemm/Conv nodes that can
go back to the low type together (found by bisection, not one candidate per node) and says so in a warning, instead
of bisecting and pruning for half an hour.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx

from passes import to_graph
from passes.precision.convert import plan_precision
from passes.precision.types import FOLLOWER_OPS, LOW_TYPES
from passes.records import Island, PassRecord
from pipeline.precision.measure import OBSERVE_CHUNK, Feed, observe
from pipeline.progress import progress, track
from pipeline.runtime.ort.session_graph import runnable_model
from pipeline.runtime.reports.precision import SEARCH_TARGET, SearchSummary
from pipeline.settings import Settings

logger = logging.getLogger(__name__)

#: After bisection, at most this many nodes are tried back in the low type (heavy ops first).
MAX_PRUNE = 24
#: From this many ranked nodes on, the search stops when half of them in float32 misses the tolerance (spread error).
SPREAD_MIN_NODES = 32
#: Ops whose nodes pruning tries first: they matter most for speed.
HEAVY_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")


class Candidates(Protocol):
    """What the search needs of the precision stage: the low-precision graph for a set of extra islands, and its
    worst error on the calibration inputs as a multiple of the tolerance."""

    @property
    def settings(self) -> Settings:
        """The conversion's settings (the low type asked for, the providers)."""
        ...

    @property
    def fp32_model(self) -> onnx.ModelProto:
        """The float32 graph the low-precision candidates are made from."""
        ...

    @property
    def feeds(self) -> Sequence[Feed]:
        """The calibration inputs the candidates are scored on."""
        ...

    @property
    def builds(self) -> int:
        """How many candidate graphs were built so far."""
        ...

    def build(self, islands: Sequence[Island]) -> tuple[onnx.ModelProto, list[PassRecord]]:
        """The low-precision graph with ``islands`` kept in float32, and the pass records."""
        ...

    def score(self, model: onnx.ModelProto) -> float:
        """``model``'s worst error on the calibration inputs, as a multiple of the tolerance."""
        ...


@dataclass(frozen=True)
class SearchResult:
    """The searched islands and what the search did (None: no set of ranked nodes meets the target), and a warning
    for the report when the search stopped early."""

    islands: list[Island]
    summary: SearchSummary | None
    warning: str = ""


class _Errors:
    """Relative RMS error per tensor, accumulated over feeds: sqrt(sum (a - b)^2 / sum b^2)."""

    def __init__(self) -> None:
        self.diff: dict[str, float] = {}
        self.norm: dict[str, float] = {}
        self.broken: set[str] = set()

    def add(self, name: str, got: np.ndarray, want: np.ndarray) -> None:
        got64, want64 = got.astype(np.float64), want.astype(np.float64)
        finite = np.isfinite(want64)
        if not np.isfinite(got64[finite]).all():
            self.broken.add(name)
            return
        self.diff[name] = self.diff.get(name, 0.0) + float(np.sum((got64[finite] - want64[finite]) ** 2))
        self.norm[name] = self.norm.get(name, 0.0) + float(np.sum(want64[finite] ** 2))

    def of(self, name: str) -> float:
        if name in self.broken:
            return float("inf")
        if name not in self.diff:
            return 0.0
        return float(np.sqrt(self.diff[name] / max(self.norm[name], 1e-30)))


def rank_by_sensitivity(
    reference: onnx.ModelProto,
    candidate: onnx.ModelProto,
    feeds: Sequence[Feed],
    nodes: Sequence[str],
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> list[tuple[str, float]]:
    """``nodes`` (names in ``reference``) ordered by the error each adds in ``candidate``, largest first."""
    by_name = {n.name: n for n in reference.graph.node}
    wanted = [n for n in nodes if n in by_name]
    available = _tensor_names(candidate)
    tensors = list(dict.fromkeys(t for n in wanted for t in (*by_name[n].input, *by_name[n].output) if t in available))
    errors = _Errors()
    held: dict[tuple[str, int], np.ndarray] = {}  # one chunk of float32 values, until the candidate's arrive

    def hold(name: str, index: int, value: np.ndarray) -> None:
        held[(name, index)] = value

    def compare(name: str, index: int, value: np.ndarray) -> None:
        errors.add(name, value, held.pop((name, index)))

    starts = range(0, len(tensors), OBSERVE_CHUNK)
    for start in track(starts, len(starts), "precision search: ranking", unit="chunk"):
        chunk = tensors[start : start + OBSERVE_CHUNK]
        observe(reference, feeds, chunk, hold, providers)
        observe(candidate, feeds, chunk, compare, providers)
    scores = []
    for name in wanted:
        node = by_name[name]
        out = max((errors.of(t) for t in node.output if t in available), default=0.0)
        into = max((errors.of(t) for t in node.input if t in available), default=0.0)
        added = out - into if np.isfinite(into) else 0.0  # inf when this node is where inf or NaN appears
        scores.append((name, float(added)))
    return sorted(scores, key=lambda item: -item[1])


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    names = {i.name for i in model.graph.input}
    names.update(o for n in model.graph.node for o in n.output if o)
    return names


def most_tries(count: int) -> int:
    """How many times :func:`shortest_passing_prefix` calls ``passes`` at most for ``count`` candidates."""
    return 1 + math.ceil(math.log2(count)) if count > 1 else count


def shortest_passing_prefix(
    count: int, passes: Callable[[int], bool], description: str = "precision search"
) -> int | None:
    """The smallest ``k`` in ``1..count`` with ``passes(k)``, assuming more is never worse; None if even ``count``
    fails. ``passes(0)`` is taken as known to fail. On a terminal a progress bar labelled ``description`` counts the
    tries (at most :func:`most_tries`); each try is logged at debug level."""
    if count == 0:
        return None
    total = most_tries(count)
    with progress(total, description, unit="try") as bar:
        tries = 0

        def attempt(k: int) -> bool:
            nonlocal tries
            tries += 1
            bar.status(f"try {tries} of {total}: {k} of {count} nodes in float32")
            ok = passes(k)
            verdict = "within the target" if ok else "above it"
            logger.debug("%s: try %d of %d (float32: %d of %d): %s", description, tries, total, k, count, verdict)
            bar.update()
            return ok

        if not attempt(count):
            return None
        low, high = 1, count
        while low < high:
            middle = (low + high) // 2
            if attempt(middle):
                high = middle
            else:
                low = middle + 1
    return low


def search_islands(candidates: Candidates, islands: list[Island], first: onnx.ModelProto, error: float) -> SearchResult:
    """Rank the low nodes of ``first`` (the graph with ``islands``, ``error`` x the tolerance) by the error each adds,
    keep the shortest head of that ranking in float32 that brings the calibration error to ``SEARCH_TARGET`` of the
    tolerance, then put back in the low type every node of that head the target does not need (MatMul/Gemm/Conv
    first). With :data:`SPREAD_MIN_NODES` ranked nodes or more, the first two candidates say whether the error is
    spread (see the module docstring): all the ranked nodes in float32, then the most error-adding half; then the
    heavy nodes go back to the low type by bisection (:func:`_heavy_back`)."""
    settings = candidates.settings
    started, builds_before = time.perf_counter(), candidates.builds
    plan = plan_precision(to_graph(candidates.fp32_model)[0], settings, islands)
    ops = {n.name: n.op_type for n in candidates.fp32_model.graph.node}
    movable = [n for n in sorted(plan.low_nodes) if ops.get(n) not in FOLLOWER_OPS | {"Cast", "Constant"}]
    emulated = runnable_model(first, "onnxruntime", settings)
    ranked = rank_by_sensitivity(candidates.fp32_model, emulated, candidates.feeds, movable, settings.ort_providers)
    count = len(ranked)
    errors: dict[int, float] = {}  # each head is built and scored once

    def chosen(k: int) -> list[Island]:
        return [
            Island(name, ops[name], "search", f"adds relative error {score:.2e} (rank {rank + 1} of {count})")
            for rank, (name, score) in enumerate(ranked[:k])
        ]

    def passes(k: int) -> bool:
        if k not in errors:
            errors[k] = candidates.score(candidates.build([*islands, *chosen(k)])[0])
        return errors[k] <= SEARCH_TARGET

    half = (1 + count) // 2  # the bisection's first middle: asking it first costs nothing more
    if count >= SPREAD_MIN_NODES and passes(count) and not passes(half) and errors[half] > 1:
        kept, final_error = _heavy_back(candidates, islands, chosen(count), errors[count])
        warning = _spread_warning(settings, ranked, ops, errors, half, len(kept))
        logger.warning("precision search: %s", warning)
        summary = SearchSummary(count, candidates.builds, len(kept), count - len(kept), error, final_error)
        _log_cost(candidates.builds - builds_before, started)
        return SearchResult(kept, summary, warning)
    head = shortest_passing_prefix(count, passes, f"precision search ({settings.precision})")
    if head is None:
        logger.warning("precision search: with all %d ranked nodes in float32 the error stays above target", count)
        _log_cost(candidates.builds - builds_before, started)
        return SearchResult([], None)
    kept, final_error = _prune(candidates, islands, chosen(head), errors[head])
    _log_cost(candidates.builds - builds_before, started)
    return SearchResult(kept, SearchSummary(count, candidates.builds, len(kept), head - len(kept), error, final_error))


def _heavy_back(
    candidates: Candidates, islands: list[Island], ranked: list[Island], error: float
) -> tuple[list[Island], float]:
    """``ranked`` (every ranked node, within the target at ``error``) less the most MatMul/Gemm/Conv nodes that can go
    back to the low type together, the least error-adding first: one candidate with all of them back, then bisection
    over how many stay in float32 (about log2 of their count), instead of one candidate per node."""
    heavy = [i for i in ranked if i.op in HEAVY_OPS]  # in rank order: the most error-adding first
    light = [i for i in ranked if i.op not in HEAVY_OPS]
    errors = {len(heavy): error}

    def passes(kept: int) -> bool:
        if kept not in errors:
            errors[kept] = candidates.score(candidates.build([*islands, *light, *heavy[:kept]])[0])
        return errors[kept] <= SEARCH_TARGET

    kept = 0 if passes(0) else shortest_passing_prefix(len(heavy), passes, "precision search: heavy nodes back")
    kept = len(heavy) if kept is None else kept  # never None: all of them in float32 is within the target
    return [*light, *heavy[:kept]], errors[kept]


def _spread_warning(
    settings: Settings,
    ranked: Sequence[tuple[str, float]],
    ops: dict[str, str],
    errors: dict[int, float],
    half: int,
    kept: int,
) -> str:
    dtype = LOW_TYPES[settings.precision].dtype_name
    count = len(ranked)
    top = ", ".join(f"{name} ({ops[name]})" for name, _ in ranked[:3])
    wider = (
        "precision='bf16' (float32's range: where PyTorch's own float16 overflows, its bfloat16 run anchors the "
        "tolerance), "
        if dtype == "float16"
        else ""
    )
    return (
        f"the {dtype} error is spread over the graph, not added by a few nodes: with the {half} of {count} ranked "
        f"nodes that add the most error kept in float32 it is still {errors[half]:.3g} x the tolerance (all {count}: "
        f"{errors[count]:.3g} x), so the search keeps {kept} of them in float32 (every ranked node but the "
        "MatMul/Gemm/Conv nodes that can go back together) rather than bisect and prune node by node a graph that "
        f"keeps most of its nodes in float32 either way; the nodes that add the most: {top}. "
        f"Fix: {wider}keep_fp32=['module:...'] the part where the error starts, a looser "
        f"tolerances={{'{dtype}': (atol, rtol)}}, or precision='fp32'"
    )


def _log_cost(builds: int, started: float) -> None:
    logger.info(
        "precision search: %d candidate graphs built and scored in %.0f s", builds, time.perf_counter() - started
    )


def _prune(
    candidates: Candidates, islands: list[Island], selected: list[Island], error: float
) -> tuple[list[Island], float]:
    order = sorted(range(len(selected)), key=lambda i: (selected[i].op not in HEAVY_OPS, -i))
    kept = list(selected)
    with progress(len(order[:MAX_PRUNE]), "precision search: pruning", unit="try") as bar:
        for index in order[:MAX_PRUNE]:
            trial = [i for i in kept if i is not selected[index]]
            trial_error = candidates.score(candidates.build([*islands, *trial])[0])
            if trial_error <= SEARCH_TARGET:
                kept, error = trial, trial_error
            bar.update()
    return kept, error
