"""The program rewrite of ``exporting/histogram_edges.py``: ``torch.histogramdd`` with bin counts becomes its counts
op and one ``histogram.bin_ct`` per dimension for the edges, and the rewritten program computes what PyTorch does."""

from __future__ import annotations

import torch

from pipeline.exporting.histogram_edges import histogramdd_per_dimension


class _HistogramDD(torch.nn.Module):
    def __init__(self, bins: int | list[int], limits: list[float] | None) -> None:
        super().__init__()
        self.bins, self.limits = bins, limits

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hist, edges = torch.histogramdd(x, self.bins, range=self.limits)
        return (hist, *edges)


def test_histogramdd_is_rewritten_per_dimension_and_computes_the_same() -> None:
    for model in (_HistogramDD([3, 2, 4], None), _HistogramDD(2, [-1.0, 1.0, 0.0, 2.0, -3.0, 0.5])):
        x = torch.randn(30, 3, generator=torch.Generator().manual_seed(0))
        program = torch.export.export(model, (x,), strict=False)
        assert histogramdd_per_dimension(program.graph_module.graph) == 1
        program.graph_module.recompile()
        targets = [n.target for n in program.graph_module.graph.nodes if n.op == "call_function"]
        assert torch.ops.aten._histogramdd_from_bin_cts.default in targets
        assert targets.count(torch.ops.aten.histogram.bin_ct) == 3
        assert not any("histogramdd." in str(t) or str(t).endswith("histogramdd") for t in targets)
        for got, expected in zip(program.module()(x), model(x), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_program_without_histogramdd_is_left_alone() -> None:
    program = torch.export.export(torch.nn.ReLU(), (torch.randn(3),), strict=False)
    assert histogramdd_per_dimension(program.graph_module.graph) == 0
