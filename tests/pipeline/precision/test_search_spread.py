"""The precision search stops early when the float16 error is spread over the graph (pipeline.precision.search.
search_islands): Florence-2's encoder graph (90M weights, 322 ranked nodes) needed 318 of them in float32, and the
search bisected and then pruned one node at a time, each candidate a 25 s build and run and each accepted one a 40-55 s
TensorRT-RTX build: stopped after 16 minutes with 18 of its 24 pruning tries to go. Its residual additions rounded the
stream to float16 and ranked last.

Here a residual stream held near 1000 (float16's step is 0.5 there) is rounded by every block's residual Add, and
``h - 1000`` cancels what is left: any Add in float16 misses the tolerance, so every Add must stay in float32, and the
ranking puts them last (each adds little error relative to 1000), as Florence-2's did. Before, the search built 31
graphs here (6 bisection tries, then 24 pruning tries) to keep 38 of the 52 ranked nodes in float32; now 4, keeping
42, with every Linear layer in float16 either way."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import pipeline
from pipeline.precision.search import SPREAD_MIN_NODES


class ResidualNear1000(nn.Module):
    """A residual stream around 1000: blocks read ``h - 1000`` and add their output back to ``h``."""

    def __init__(self, blocks: int = 10, width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + 1000.0
        for block in self.blocks:
            h = h + 0.5 * torch.tanh(block(h - 1000.0))
        return h - 1000.0


def test_a_spread_float16_error_stops_the_search_after_three_candidates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    model, sample = ResidualNear1000().eval(), torch.randn(4, 16)
    with caplog.at_level(logging.INFO, logger="pipeline.precision.search"):
        # PyTorch's own float16 rounds as much (the anchored rule would pass it): the fixed rule makes the search run,
        # as it did on Florence-2 whose own float16 run is inf
        module = pipeline.convert(model, sample, backend="onnxruntime", precision="fp16", accuracy_anchor=False)
    report = module.report.precision
    assert report is not None and report.search is not None
    search = report.search
    assert search.candidates >= SPREAD_MIN_NODES and search.error_before > 1 and search.error_after <= search.target
    # the first graph; every ranked node in float32, then the most error-adding half (still above the tolerance:
    # spread); then every Gemm back in float16 at once: 4 graphs, where bisecting and pruning built 31 (1 + 6 + 24)
    assert search.builds == 4, search
    assert report.share == 1.0 and search.pruned == 10  # the ten Linear layers went back to float16 together
    warning = report.warnings[0] if report.warnings else ""
    assert warning.startswith("the float16 error is spread over the graph") and "Fix: precision='bf16'" in warning
    assert any("spread over the graph" in r.message for r in caplog.records if r.levelno == logging.WARNING)
    assert any("3 candidate graphs built and scored" in r.message for r in caplog.records)
    # the module is within the policy: validation passed on inputs the search never saw
    assert module.report.accuracy is not None and module.report.accuracy.passed
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert float((module(x) - model(x)).abs().max()) < 1e-2
