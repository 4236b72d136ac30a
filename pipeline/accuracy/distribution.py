"""Outputs of random ops: found from the graph's random nodes and judged by their distribution, not value by value.

``torch.normal``, ``bernoulli``, ``multinomial``, ``rand_like``, ``exponential_``... draw from PyTorch's generator; the
exported graph draws from its own (``RandomNormalLike``, ``RandomUniformLike``, ``Bernoulli``, ``Multinomial``, a
``Dropout`` in training mode). Their values never agree, so every tensor that depends on a random node is judged
by the rule of :data:`RULE`: same shape, same kind of values, and the two samples of values drawn from the same
distribution by the two-sample Kolmogorov-Smirnov test, whose bound shrinks with the number of values compared.
A dimension whose size the graph computes from data (not from an input's shape: a length drawn by the model, as VITS's
waveform length is from its stochastic durations) may differ between the two runs (:func:`drawn_dims`); the rank and
every other dimension may not.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx

logger = logging.getLogger(__name__)

#: ONNX ops whose outputs are random draws.
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}
)

#: sqrt(-ln(alpha / 2) / 2) for alpha = 1e-6: a correct graph fails about once in a million comparisons.
KS_COEFFICIENT = 2.69

#: At most this many values per side are kept (a seeded subsample beyond): the test needs no more.
MAX_VALUES = 200_000

#: PyTorch is drawn this many more times on the same inputs when a random output fails the KS bound: its own spread.
YARDSTICK_DRAWS = 6

#: The graph's KS distance from PyTorch passes within this multiple of PyTorch's furthest draw from itself.
YARDSTICK_MARGIN = 2.0

RULE = (
    "an output that depends on a random node is judged by distribution, not value by value: same shape, same "
    "kind of values (a dimension the graph sizes from computed data may differ), and a two-sample "
    f"Kolmogorov-Smirnov distance <= {KS_COEFFICIENT} * sqrt((n + m) / (n * m)) "
    "(n, m: the independent values compared on each side, over all inputs: the values scaled by (1 - r) / (1 + r), "
    "r the correlation of neighbours along the last axis when positive, as a waveform's are; NaN counted as +inf); "
    f"beyond that bound, within {YARDSTICK_MARGIN:g}x the furthest of {YARDSTICK_DRAWS} more PyTorch draws on the "
    "same inputs from PyTorch's first (an output whose values share a draw, as a generated waveform's do, varies "
    "between draws more than independent values would)"
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
    shape_varies: str | None = None
    independent: float | None = None  # the independent values the bound counts, when neighbours correlate
    torch_spread: float | None = None  # the furthest of PyTorch's further draws from its first, when measured

    @property
    def passed(self) -> bool:
        """Shapes and kinds agree and the KS distance is within its bound, or within PyTorch's own spread."""
        return self.shape_mismatch is None and (self.ks_distance <= self.ks_bound or self.within_spread)

    @property
    def within_spread(self) -> bool:
        """The KS distance is within :data:`YARDSTICK_MARGIN` times PyTorch's own spread (when measured)."""
        return self.torch_spread is not None and self.ks_distance <= YARDSTICK_MARGIN * self.torch_spread

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
        if self.shape_varies is not None:
            what += self.shape_varies + "; "
        relation = "<=" if self.ks_distance <= self.ks_bound else ">"
        counted = f" ({self.independent:.0f} independent)" if self.independent is not None else ""
        spread = ""
        if self.torch_spread is not None:  # measured only when the bound failed
            within = "within" if self.within_spread else "beyond"
            spread = (
                f"; PyTorch's own further draws are up to {self.torch_spread:.3g} from its first: {within} "
                f"{YARDSTICK_MARGIN:g}x that"
            )
        return (
            what + f"KS distance {self.ks_distance:.3g} {relation} bound {self.ks_bound:.3g} over "
            f"{self.elements} values{counted}{spread}; mean {self.mean:.4g} (torch {self.reference_mean:.4g}), "
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

    def __init__(self, sources: Iterable[str], free_dims: Iterable[int] = ()) -> None:
        self.sources = tuple(sources)
        self.free_dims = frozenset(free_dims)  # dimensions sized by computed data: they may differ between runs
        self.actual: list[np.ndarray] = []
        self.reference: list[np.ndarray] = []
        self.mismatch: str | None = None
        self.varies: str | None = None
        self.counts = [0, 0]
        self.independent = [0.0, 0.0]  # the values' count, each scaled by its correlation with its neighbours
        self.spread: float | None = None  # the furthest of PyTorch's further draws (:meth:`add_torch_draw`)
        self.rng = np.random.default_rng(0)

    def add(self, actual: np.ndarray, reference: np.ndarray) -> None:
        """Keep one pair's values (after checking shapes and kinds)."""
        actual, reference = np.asarray(actual), np.asarray(reference)
        if actual.shape != reference.shape:
            shapes = f"shape {list(actual.shape)} against the reference's {list(reference.shape)}"
            differ = {i for i, (a, b) in enumerate(zip(actual.shape, reference.shape, strict=True)) if a != b}
            if actual.ndim == reference.ndim and differ <= self.free_dims:
                self.varies = self.varies or f"{shapes} (dimension {', '.join(map(str, sorted(differ)))} sized by data)"
            else:
                self.mismatch = shapes
        elif _kind(actual) != _kind(reference):
            self.mismatch = f"{_kind(actual)} values against the reference's {_kind(reference)} values"
        self.counts[0] += int(actual.size)
        self.counts[1] += int(reference.size)
        self.independent[0] += actual.size * _independence(actual)
        self.independent[1] += reference.size * _independence(reference)
        # bounded memory: a seeded subsample of a large tensor is as good a sample of its distribution
        self.actual.append(_subsample(_values(actual), self.rng))
        self.reference.append(_subsample(_values(reference), self.rng))

    def add_torch_draw(self, draws: Sequence[np.ndarray]) -> None:
        """PyTorch's outputs on the inputs added so far (in order), drawn again: their KS distance from its first
        draw widens :attr:`spread`, PyTorch's own variation between draws."""
        rng = np.random.default_rng(len(draws))
        again = _subsample(np.concatenate([_subsample(_values(np.asarray(d)), rng) for d in draws]), rng)
        first = _subsample(np.concatenate(self.reference), rng)
        self.spread = max(self.spread or 0.0, ks_distance(again, first) if again.size and first.size else 0.0)

    def result(self) -> DistributionStats:
        """The pooled samples' figures and the KS verdict."""
        a = _subsample(np.concatenate(self.actual) if self.actual else np.zeros(0), self.rng)
        b = _subsample(np.concatenate(self.reference) if self.reference else np.zeros(0), self.rng)
        distance = ks_distance(a, b) if a.size and b.size else 0.0
        # the samples kept, scaled by the share of independent values among all: correlated neighbours (a waveform,
        # an image) carry less evidence than as many independent draws, and a bound counting them all is too tight
        n, m = (
            kept * min(1.0, free / max(count, 1))
            for kept, free, count in zip((a.size, b.size), self.independent, self.counts, strict=True)
        )
        bound = KS_COEFFICIENT * math.sqrt((n + m) / (n * m)) if n > 0 and m > 0 else 1.0
        correlated = self.independent[0] < 0.99 * self.counts[0] or self.independent[1] < 0.99 * self.counts[1]
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
            shape_varies=self.varies,
            independent=min(n, m) if correlated and a.size and b.size else None,
            torch_spread=self.spread,
        )


def measure_torch_spread(
    accumulators: Iterable[tuple[str, Any]], call: Callable[[Any], dict[str, np.ndarray]], feeds: Sequence[Any]
) -> list[str]:
    """For each :class:`DistributionAccumulator` of ``accumulators`` ((output name, accumulator) pairs: one output may
    have one per backend compared) that fails the KS bound with shapes that agree, draw PyTorch (``call``: a feed -> its
    outputs by name) :data:`YARDSTICK_DRAWS` more times on ``feeds`` (the inputs compared, in order), once for all, to
    measure its own spread. Returns the outputs measured."""
    failing = [
        (name, acc)
        for name, acc in accumulators
        if isinstance(acc, DistributionAccumulator) and acc.mismatch is None and not acc.result().passed
    ]
    names = list(dict.fromkeys(name for name, _ in failing))
    if failing and feeds:
        logger.info(
            "validation: %s fail the distribution bound: drawing PyTorch %d more times for its own spread",
            ", ".join(names),
            YARDSTICK_DRAWS,
        )
        for _ in range(YARDSTICK_DRAWS):
            outputs = [call(feed) for feed in feeds]
            for name, acc in failing:
                acc.add_torch_draw([o[name] for o in outputs])
    return names


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


def drawn_dims(model: onnx.ModelProto) -> dict[str, frozenset[int]]:
    """The graph outputs -> their dimensions sized by data the graph computes: a symbolic size none of whose symbols
    sizes an input (torch.export's unbacked ``u12``, ``256*u12``), or no size at all. A random output's such
    dimension may differ from PyTorch's (the length is drawn too).

    >>> from onnx import helper, TensorProto
    >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s0", 4])
    >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["s0", "256*u12", 4])
    >>> drawn_dims(helper.make_model(helper.make_graph([], "g", [x], [y])))
    {'y': frozenset({1})}
    """
    symbols = set()
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            symbols.update(_SYMBOL.findall(dim.dim_param))
    drawn = {}
    for value in model.graph.output:
        kept = frozenset(i for i, dim in enumerate(value.type.tensor_type.shape.dim) if _sized_by_data(dim, symbols))
        if kept:
            drawn[value.name] = kept
    return drawn


_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _sized_by_data(dim: onnx.TensorShapeProto.Dimension, input_symbols: set[str]) -> bool:
    if dim.HasField("dim_value"):
        return False
    names = set(_SYMBOL.findall(dim.dim_param))
    return not names or not names <= input_symbols


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


def _independence(array: np.ndarray) -> float:
    """(1 - r) / (1 + r), r the correlation of neighbours along the last axis (0 when negative or not finite): the
    share of independent values in a first-order autoregressive series (1 for independent draws)."""
    if array.ndim == 0 or array.shape[-1] < 2 or array.dtype == np.bool_:
        return 1.0
    values = array.astype(np.float64)
    if not np.isfinite(values).all():
        return 1.0
    centred = values - values.mean()
    spread = float(np.sum(centred * centred))
    if spread == 0.0:
        return 1.0
    r = float(np.sum(centred[..., 1:] * centred[..., :-1])) / spread
    r = min(max(r, 0.0), 0.999)
    return (1 - r) / (1 + r)


def _subsample(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return values if values.size <= MAX_VALUES else rng.choice(values, MAX_VALUES, replace=False)


def _moment(values: np.ndarray, function: Any) -> float:
    finite = values[np.isfinite(values)]
    return float(function(finite)) if finite.size else float("nan")
