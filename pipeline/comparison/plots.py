"""PNG plots of a comparison, drawn with matplotlib (the optional ``plots`` extra, imported only when a plot is drawn).

Two plots: the histogram of absolute errors of one output (one bar colour per runner, log10 bins, the output's
``atol`` as a dashed line) and the per-layer plot (max absolute error of each matched module, modules named on the
vertical axis in execution order, failing modules in red, exact zeros marked as such, the first divergence
marked). Without matplotlib no picture is drawn: :func:`missing_reason` says so and how to get them, and the
report prints that instead.
"""

from __future__ import annotations

import importlib.util
import io
import math
from collections.abc import Sequence
from typing import Any

PASS_COLOR = "#1f77b4"
FAIL_COLOR = "#d62728"
ZERO_COLOR = "#2ca02c"
SERIES: tuple[str, ...] = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")
INSTALL = "pip install 'torch-trt-pipeline[plots]'"
MAX_LABELS = 80  # module names drawn on the per-layer axis; beyond it every k-th (failing ones always)
_DPI = 100


def available() -> bool:
    """Whether matplotlib can be imported (the plots are drawn)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a broken or blocked installation is not one we can draw with
        return False


def missing_reason() -> str | None:
    """None when plots are drawn; else why not and the command that gets them."""
    if available():
        return None
    return f"plots not drawn: matplotlib is not installed (for the PNG plots: {INSTALL})"


def histogram_png(
    output: str,
    counts_by_runner: Sequence[tuple[str, Sequence[int]]],
    edges: Sequence[float],
    atol: float,
    label: str | None = None,
) -> bytes:
    """The PNG of :func:`histogram_figure`."""
    return png(histogram_figure(output, counts_by_runner, edges, atol, label))


def histogram_figure(
    output: str,
    counts_by_runner: Sequence[tuple[str, Sequence[int]]],
    edges: Sequence[float],
    atol: float,
    label: str | None = None,
) -> Any:
    """A matplotlib figure: bars of absolute-error counts per log10 bin of ``edges``; ``counts`` have one more bin
    at each end (below the range, exact zeros included; above it or NaN), drawn one decade wide beside the range.
    ``atol`` (the one the verdict used) is a dashed line, named ``label`` in the legend (default ``atol <atol>``)."""
    figure = _figure(7.2, 4.2)
    axes = figure.add_subplot()
    low, high = float(edges[0]), float(edges[-1])
    lefts = [low - 1.0, *edges[:-1], high]
    widths = [1.0, *(b - a for a, b in zip(edges, edges[1:], strict=False)), 1.0]
    runners = max(len(counts_by_runner), 1)
    for r, (runner, counts) in enumerate(counts_by_runner):
        share = [w / runners for w in widths]
        positions = [left + r * s for left, s in zip(lefts, share, strict=True)]
        color = SERIES[r % len(SERIES)]
        counts = list(counts)
        axes.bar(positions[1:-1], counts[1:-1], width=share[1:-1], align="edge", color=color, label=runner)
        ends = [0, len(counts) - 1]  # the open-ended bins, hatched
        axes.bar(
            [positions[i] for i in ends],
            [counts[i] for i in ends],
            width=[share[i] for i in ends],
            align="edge",
            color=color,
            hatch="///",
            edgecolor="white",
        )
    if atol > 0:
        axes.axvline(math.log10(atol), color=FAIL_COLOR, linestyle="--", linewidth=1.2, label=label or f"atol {atol:g}")
    decades = [e for e in range(math.ceil(low) + 2, math.floor(high) - 1, 2)]  # the ends carry the open bins' labels
    axes.set_xticks(
        [low - 0.5, *decades, high + 0.5],
        [f"< 1e{int(low)}\n(and 0)", *(f"1e{d}" for d in decades), f">= 1e{int(high)}\nor NaN"],
        fontsize=8,
    )
    axes.set_xlim(low - 1.0, high + 1.0)
    if any(c for _, counts in counts_by_runner for c in counts):
        axes.set_yscale("log")
    axes.set_xlabel("|x - ref| (log10 bins)")
    axes.set_ylabel("elements")
    axes.set_title(f"absolute error of {output}")
    axes.grid(axis="y", alpha=0.3)
    figure.legend(loc="outside right upper", fontsize=8)
    return figure


def depth_png(modules: Sequence[str], max_abs: Sequence[float], passed: Sequence[bool], title: str) -> bytes:
    """The PNG of :func:`depth_figure`."""
    return png(depth_figure(modules, max_abs, passed, title))


def depth_figure(modules: Sequence[str], max_abs: Sequence[float], passed: Sequence[bool], title: str) -> Any:
    """A matplotlib figure: max absolute error of each module (execution order, top to bottom) on a log axis;
    failing modules red, exact zeros as green rings at the axis' left edge (a log axis has no 0), the first
    divergence marked."""
    count = len(modules)
    figure = _figure(9.0, min(max(2.2 + 0.17 * min(count, MAX_LABELS * 2), 3.2), 30.0))
    axes = figure.add_subplot()
    values = [float(v) for v in max_abs]
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    floor = 10.0 ** math.floor(math.log10(min(finite)) - 1) if finite else 1e-12
    ceiling = 10.0 ** math.ceil(math.log10(max(finite)) + 0.3) if finite else 1.0
    drawn = [v if v > 0 and math.isfinite(v) else (floor if v == 0 else ceiling) for v in values]
    rows = list(range(count))
    axes.plot(drawn, rows, color="#b0b0b0", linewidth=0.8, zorder=1)
    groups = (
        ("within tolerance", PASS_COLOR, "o", [i for i in rows if passed[i] and values[i] != 0]),
        ("outside tolerance", FAIL_COLOR, "o", [i for i in rows if not passed[i]]),
        ("exactly 0 (drawn at the left edge)", ZERO_COLOR, "o", [i for i in rows if passed[i] and values[i] == 0]),
    )
    for label, color, marker, chosen in groups:
        if not chosen:
            continue
        hollow = color == ZERO_COLOR
        axes.scatter(
            [drawn[i] for i in chosen],
            chosen,
            s=22,
            marker=marker,
            facecolors="none" if hollow else color,
            edgecolors=color,
            linewidths=1.5,
            label=label,
            zorder=3,
        )
    axes.set_xscale("log")
    axes.set_xlim(floor / 2, ceiling)
    _module_axis(axes, modules, passed)
    first = next((i for i, ok in enumerate(passed) if not ok), None)
    if first is not None:
        label = f"first divergence: {modules[first]}"
        axes.axhline(first, color=FAIL_COLOR, linestyle="--", linewidth=1.0, label=label)
    axes.set_xlabel("max |x - ref| (log scale)")
    axes.set_title(title)
    axes.grid(axis="x", alpha=0.3)
    figure.legend(loc="outside upper center", ncols=2, fontsize=8)
    return figure


def _module_axis(axes: Any, modules: Sequence[str], passed: Sequence[bool]) -> None:
    """Module names on the vertical axis, top to bottom; past :data:`MAX_LABELS` every k-th name and every failing
    one (the others stay as points)."""
    count = len(modules)
    step = max(1, math.ceil(count / MAX_LABELS))
    shown = sorted({i for i in range(0, count, step)} | {i for i in range(count) if not passed[i]})
    axes.set_yticks(shown, [_short(modules[i]) for i in shown], fontsize=7 if count > 30 else 8)
    for tick, index in zip(axes.get_yticklabels(), shown, strict=True):
        if not passed[index]:
            tick.set_color(FAIL_COLOR)
    axes.set_ylim(count - 0.5, -0.5)  # execution order reads downwards
    axes.set_ylabel("module (execution order)" + (f", 1 name in {step}" if step > 1 else ""))


def _short(name: str, limit: int = 64) -> str:
    return name if len(name) <= limit else "..." + name[-(limit - 3) :]


def _figure(width: float, height: float) -> Any:
    """A figure on an Agg canvas, not attached to pyplot (no global state, no display backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def png(figure: Any) -> bytes:
    """A figure as PNG bytes (at the plots' resolution)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_DPI)
    return buffer.getvalue()
