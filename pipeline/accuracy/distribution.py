"""Outputs of random ops: found from the graph's random nodes and judged by their distribution, not value by value.

``torch.normal``, ``bernoulli``, ``multinomial``, ``rand_like``, ``exponential_``... draw from PyTorch's generator; the
exported graph draws from its own (``RandomNormalLike``, ``RandomUniformLike``, ``Bernoulli``, ``Multinomial``, a
``Dropout`` in training mode). Their values never agree, so every tensor that depends on a random node is judged
by the rule of :data:`RULE`: same shape, same kind of values, and the two samples of values drawn from the same
distribution by the two-sample Kolmogorov-Smirnov test, whose bound shrinks with the number of values compared.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx

#: ONNX ops whose outputs are random draws.
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}
)

#: sqrt(-ln(alpha / 2) / 2) for alpha = 1e-6: a correct graph fails about once in a million comparisons.
KS_COEFFICIENT = 2.69

#: At most this many values per side are kept (a seeded subsample beyond): the test needs no more.
MAX_VALUES = 200_000

RULE = (
    "an output that depends on a random node is judged by distribution, not value by value: same shape, same "
    f"kind of values, and a two-sample Kolmogorov-Smirnov distance <= {KS_COEFFICIENT} * sqrt((n + m) / (n * m)) "
    "(n, m: the values compared on each side, over all inputs; NaN counted as +inf)"
)


@dataclass(frozen=True)
class DistributionStats:
    """A random output against PyTorch's, over all inputs: the two samples' figures and the verdict's."""

    elements: int
    reference_elements: int
    mean: float
    std: float
    reference_mean: float
    reference_std: float
    ks_distance: float
    ks_bound: float
    sources: tuple[str, ...]
    shape_mismatch: str | None = None

    @property
    def passed(self) -> bool:
        """Shapes and kinds agree and the KS distance is within its bound."""
        return self.shape_mismatch is None and self.ks_distance <= self.ks_bound

    @property
    def outside(self) -> int:
        """Elements outside the rule: none when the distribution matches, all of them when it does not."""
        return 0 if self.passed else self.elements

    @property
    def note(self) -> str:
        """The verdict in words, for reports and errors."""
        what = f"random (depends on {', '.join(self.sources)}): judged by distribution, not value by value: "
        if self.shape_mismatch is not None:
            return what + self.shape_mismatch
        if not self.elements:
            return what + "no values to compare"
        relation = "<=" if self.ks_distance <= self.ks_bound else ">"
        return (
            what + f"KS distance {self.ks_distance:.3g} {relation} bound {self.ks_bound:.3g} over "
            f"{self.elements} values; mean {self.mean:.4g} (torch {self.reference_mean:.4g}), "
            f"std {self.std:.4g} (torch {self.reference_std:.4g})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready data (non-finite floats as strings)."""
        data = {**asdict(self), "sources": list(self.sources), "passed": self.passed, "outside": self.outside}
        data["note"] = self.note
        return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}


class DistributionAccumulator:
    """Add one (actual, reference) pair per input; ``result()`` judges all values added, pooled.

    >>> rng = np.random.default_rng(0)
    >>> acc = DistributionAccumulator(("RandomNormalLike 'n0'",))
    >>> acc.add(rng.standard_normal(1000), rng.standard_normal(1000))
    >>> acc.result().passed
    True
    """

    def __init__(self, sources: Iterable[str]) -> None:
        self.sources = tuple(sources)
        self.actual: list[np.ndarray] = []
        self.reference: list[np.ndarray] = []
        self.mismatch: str | None = None
        self.counts = [0, 0]
        self.rng = np.random.default_rng(0)

    def add(self, actual: np.ndarray, reference: np.ndarray) -> None:
        """Keep one pair's values (after checking shapes and kinds)."""
        actual, reference = np.asarray(actual), np.asarray(reference)
        if actual.shape != reference.shape:
            self.mismatch = f"shape {list(actual.shape)} against the reference's {list(reference.shape)}"
        elif _kind(actual) != _kind(reference):
            self.mismatch = f"{_kind(actual)} values against the reference's {_kind(reference)} values"
        self.counts[0] += int(actual.size)
        self.counts[1] += int(reference.size)
        # bounded memory: a seeded subsample of a large tensor is as good a sample of its distribution
        self.actual.append(_subsample(_values(actual), self.rng))
        self.reference.append(_subsample(_values(reference), self.rng))

    def result(self) -> DistributionStats:
        """The pooled samples' figures and the KS verdict."""
        a = _subsample(np.concatenate(self.actual) if self.actual else np.zeros(0), self.rng)
        b = _subsample(np.concatenate(self.reference) if self.reference else np.zeros(0), self.rng)
        distance = ks_distance(a, b) if a.size and b.size else 0.0
        bound = KS_COEFFICIENT * math.sqrt((a.size + b.size) / (a.size * b.size)) if a.size and b.size else 1.0
        return DistributionStats(
            elements=self.counts[0],
            reference_elements=self.counts[1],
            mean=_moment(a, np.mean),
            std=_moment(a, np.std),
            reference_mean=_moment(b, np.mean),
            reference_std=_moment(b, np.std),
            ks_distance=distance,
            ks_bound=bound,
            sources=self.sources,
            shape_mismatch=self.mismatch,
        )


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov distance: the largest gap between the two empirical CDFs.

    >>> ks_distance(np.array([0.0, 1.0]), np.array([0.0, 1.0]))
    0.0
    """
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    gap = np.searchsorted(a, grid, side="right") / a.size - np.searchsorted(b, grid, side="right") / b.size
    return float(np.max(np.abs(gap)))


def random_tensors(model: onnx.ModelProto) -> dict[str, tuple[str, ...]]:
    """Every tensor of ``model``'s graph that depends on a random node -> those nodes (``"Op 'name'"``).

    A node is random when it is one of :data:`RANDOM_OPS`, a ``Dropout`` given a training-mode input, a call of a
    model-local function or a control-flow node whose body holds one; dependence follows the graph's edges (and the
    outer-scope names that subgraphs use)."""
    functions = {(f.domain, f.name): f for f in model.functions}
    tainted: dict[str, tuple[str, ...]] = {}
    for node in model.graph.node:
        sources: set[str] = set()
        for name in _used_names(node):
            sources.update(tainted.get(name, ()))
        if _is_random(node, functions, set()):
            sources.add(f"{node.op_type} {node.name!r}")
        if sources:
            for output in node.output:
                if output:
                    tainted[output] = tuple(sorted(sources))
    return tainted


def random_outputs(model: onnx.ModelProto) -> dict[str, tuple[str, ...]]:
    """The graph outputs that depend on a random node -> those nodes."""
    tainted = random_tensors(model)
    return {o.name: tainted[o.name] for o in model.graph.output if o.name in tainted}


def _is_random(node: onnx.NodeProto, functions: dict[tuple[str, str], Any], seen: set[tuple[str, str]]) -> bool:
    if node.domain in ("", "ai.onnx") and node.op_type in RANDOM_OPS:
        return True
    if node.domain in ("", "ai.onnx") and node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
        return True
    key = (node.domain, node.op_type)
    if key in functions and key not in seen:
        seen.add(key)
        if any(_is_random(inner, functions, seen) for inner in functions[key].node):
            return True
    return any(_is_random(inner, functions, seen) for graph in _subgraphs(node) for inner in graph.node)


def _used_names(node: onnx.NodeProto) -> set[str]:
    """The node's inputs and every name its subgraphs read (outer-scope values included)."""
    names = {name for name in node.input if name}
    for graph in _subgraphs(node):
        for inner in graph.node:
            names |= _used_names(inner)
    return names


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            graphs.append(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attribute.graphs)
    return graphs


def _kind(array: np.ndarray) -> str:
    if array.dtype == np.bool_:
        return "bool"
    return "integer" if np.issubdtype(array.dtype, np.integer) else "float"


def _values(array: np.ndarray) -> np.ndarray:
    values = array.astype(np.float64).ravel()
    return np.where(np.isnan(values), np.inf, values)


def _subsample(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return values if values.size <= MAX_VALUES else rng.choice(values, MAX_VALUES, replace=False)


def _moment(values: np.ndarray, function: Any) -> float:
    finite = values[np.isfinite(values)]
    return float(function(finite)) if finite.size else float("nan")
