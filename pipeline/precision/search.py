"""Accuracy-driven search for float32 islands: rank nodes by how much error each adds, then bisect.

Ranking takes one observed run of the float32 graph and one of the low-precision graph: a node's sensitivity is
the relative error of its output minus the largest relative error among its inputs (what the node itself adds;
an output that turns inf or NaN where float32 is finite ranks first). Bisection then finds the shortest head of
that ranking which, kept in float32, meets the tolerance: about log2(n) builds instead of n.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from pipeline.precision.measure import OBSERVE_CHUNK, Feed, observe
from pipeline.progress import progress, track

logger = logging.getLogger(__name__)


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
