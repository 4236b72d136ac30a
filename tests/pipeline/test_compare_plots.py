"""The comparison plots (matplotlib): what a reader needs is on them, and without matplotlib the report says how to
get them instead of drawing them."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import pipeline
from pipeline.accuracy.stats import HIST_BINS, HIST_EDGES
from pipeline.comparison import plots

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("matplotlib")


def decode_png(data: bytes) -> np.ndarray:
    """A PNG as a (height, width, 3) uint8 array."""
    from PIL import Image

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def count_color(pixels: np.ndarray, color: str) -> int:
    """Pixels of exactly ``color`` ("#rrggbb")."""
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return int(np.all(pixels == np.array(rgb, dtype=np.uint8), axis=-1).sum())


def overlaps(a: object, b: object) -> bool:
    return bool(a.overlaps(b))  # type: ignore[attr-defined]


def test_layer_plot_names_modules_marks_zeros_and_keeps_the_legend_off_the_data() -> None:
    modules = ["embeddings", "encoder.layer.0.attention", "encoder.layer.0.output", "encoder.layer.1", "pooler"]
    figure = plots.depth_figure(modules, [0.0, 1e-6, 2e-2, 3e-2, 1e-7], [True, True, False, False, True], "depth")
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_yticklabels()] == modules  # names on the axis, in execution order
    red = [t.get_text() for t in axes.get_yticklabels() if t.get_color() == plots.FAIL_COLOR]
    assert red == ["encoder.layer.0.output", "encoder.layer.1"]
    legend = figure.legends[0]
    entries = [t.get_text() for t in legend.get_texts()]
    assert "exactly 0 (drawn at the left edge)" in entries
    assert "first divergence: encoder.layer.0.output" in entries
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    assert not overlaps(legend.get_window_extent(renderer), axes.get_window_extent(renderer))
    pixels = decode_png(plots.depth_png(modules, [0.0, 1e-6, 2e-2, 3e-2, 1e-7], [True] * 2 + [False] * 2 + [True], "d"))
    assert count_color(pixels, plots.FAIL_COLOR) > 50 and count_color(pixels, plots.ZERO_COLOR) > 4


def test_layer_plot_of_hundreds_of_modules_names_a_readable_subset_and_every_failure() -> None:
    modules = [f"encoder.layer.{i // 8}.block.{i % 8}" for i in range(400)]
    passed = [i != 333 for i in range(400)]
    figure = plots.depth_figure(modules, [1e-6] * 400, passed, "depth")
    names = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert len(names) <= plots.MAX_LABELS + 1 and "encoder.layer.41.block.5" in names  # module 333 fails
    assert figure.get_size_inches()[1] <= 30


def test_histogram_shows_each_runner_and_the_tolerance_outside_the_bars() -> None:
    counts = [0] * (HIST_BINS + 2)
    counts[0], counts[10], counts[-1] = 12, 40, 3
    figure = plots.histogram_figure("logits", [("onnxruntime", counts), ("tensorrt", counts)], HIST_EDGES, 1e-5)
    axes = figure.axes[0]
    labels = [t.get_text() for t in axes.get_xticklabels()]
    assert labels[0].startswith("< 1e-10") and "and 0" in labels[0] and labels[-1].startswith(">= 1e2")
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["atol 1e-05", "onnxruntime", "tensorrt"]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    assert not overlaps(figure.legends[0].get_window_extent(renderer), axes.get_window_extent(renderer))
    pixels = decode_png(plots.histogram_png("logits", [("onnxruntime", counts)], HIST_EDGES, 1e-5))
    assert count_color(pixels, plots.SERIES[0]) > 300  # the bars (the atol line: in the legend above)


def test_without_matplotlib_the_report_says_how_to_get_the_plots(tmp_path: Path) -> None:
    """matplotlib blocked in a fresh interpreter: no PNG is written, report.md and the table say what to install."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["matplotlib"] = None  # as if it were not installed
        import torch
        import pipeline
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
        report = pipeline.compare(model, torch.randn(3, 4), per_layer=True, output_dir={str(tmp_path)!r})
        print(report.table({str(tmp_path)!r}))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr
    assert not list(tmp_path.glob("*.png"))
    markdown = (tmp_path / "report.md").read_text()
    assert plots.INSTALL in markdown and "![" not in markdown
    assert plots.INSTALL in run.stdout and "0 PNG plots" in run.stdout


def test_the_report_histogram_draws_the_atol_its_verdict_used() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    report = pipeline.compare(model, torch.randn(4, 16) * 10, precision="fp16", backends=["onnxruntime"])
    row = report.to_dict()["outputs"][0]
    used = float(row["atol_used"])
    assert used > row["atol"]  # float16's magnitude-relative rule: 0.01 x RMS of the output is above atol 0.001
    shown = f"{used:.3g} (0.01 x RMS)"
    assert shown in report.table()
    figure = report.histogram(row["output"])
    assert f"atol {shown}" in [t.get_text() for t in figure.legends[0].get_texts()]
    assert figure.axes[0].lines[0].get_xdata()[0] == pytest.approx(np.log10(used))
