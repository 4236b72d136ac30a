"""Chained normalisations (Sinkhorn-Knopp iterations unrolled: DeepSeek-V4's and GLM-5 Next's hyper-connections):
each sum of a long chain becomes a MatMul with ones, the outputs equal ONNX Runtime's original within float32
rounding, and the real TensorRT-RTX builder builds a checkpoint's 20 iterations, which it does not finish as they
were (about 3x builder time per link: ``benchmarks/probe_chained_normalisation.py``). A short chain is left alone."""

from __future__ import annotations

import time

import numpy as np
import onnx_graphsurgeon as gs
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, ops, parse

import pipeline
from converters.settings import DynamicDim
from passes.chained_sums import MIN_LINKS, ChainedSumsAsMatMul
from passes.rules import Facts

HEADER = '<ir_version: 10, opset_import: ["" : 20]>\n'


def sinkhorn_text(iterations: int) -> str:
    """DeepSeek-V4's comb normalisation: columns, then rows and columns ``iterations - 1`` times, of a [N, 4, 4]."""
    body = ["eps = Constant<value = float {1e-6}>()", "cols = Constant<value = int64[1] {-2}>()"]
    body += ["rows = Constant<value = int64[1] {-1}>()", "s0 = ReduceSum(x, cols)", "t0 = Add(s0, eps)"]
    body.append("c0 = Div(x, t0)")
    links = 2 * iterations - 1
    for i in range(1, links):
        axis = "rows" if i % 2 else "cols"
        body += [f"s{i} = ReduceSum(c{i - 1}, {axis})", f"t{i} = Add(s{i}, eps)", f"c{i} = Div(c{i - 1}, t{i})"]
    body.append(f"y = Identity(c{links - 1})")
    return f"{HEADER}g (float[N,4,4] x) => (float[N,4,4] y) {{ {' '.join(body)} }}"


def test_twenty_iterations_are_matmuls_equal_and_build() -> None:
    model = parse(sinkhorn_text(20))
    after, result = apply(ChainedSumsAsMatMul(), model)
    assert result.modified
    assert ops(after).count("ReduceSum") == 0 and ops(after).count("MatMul") == 39
    x = np.random.default_rng(0).random((3, 4, 4)).astype(np.float32) + 0.1
    assert_same_outputs(model, after, {"x": x}, rtol=1e-5, atol=1e-6)
    start = time.perf_counter()
    assert rtx_build_error(after, [DynamicDim("x", 0, "N", 1, 2, 8)]) is None
    assert time.perf_counter() - start < 120  # as they were, 6 links take 1.8 s, 8 take 40 s, 12 more than 300 s


def test_a_short_chain_is_left_and_says_why() -> None:
    model = parse(sinkhorn_text(MIN_LINKS // 2))  # MIN_LINKS - 1 links
    assert_unchanged(ChainedSumsAsMatMul(), model)
    graph = gs.import_onnx(model)
    node = next(n for n in graph.nodes if n.op == "ReduceSum")
    reason = ChainedSumsAsMatMul().check(node, Facts(graph))
    assert isinstance(reason, str) and f"a chain of {MIN_LINKS - 1} normalisation(s)" in reason


def test_a_sum_that_divides_nothing_is_left() -> None:
    model = parse(
        f"{HEADER}g (float[3,4] x) => (float[3,1] y) {{ a = Constant<value = int64[1] {{-1}}>() y = ReduceSum(x, a) }}"
    )
    assert_unchanged(ChainedSumsAsMatMul(), model)


class Sinkhorn(torch.nn.Module):
    """A hyper-connection's comb weights as DeepSeek-V4 computes them (softmax, then Sinkhorn-Knopp iterations)."""

    def __init__(self, iterations: int = 20) -> None:
        super().__init__()
        self.iterations = iterations
        self.proj = torch.nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        comb = torch.softmax(self.proj(x).view(*x.shape[:-1], 4, 4), dim=-1) + 1e-6
        comb = comb / (comb.sum(dim=-2, keepdim=True) + 1e-6)
        for _ in range(self.iterations - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + 1e-6)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + 1e-6)
        return comb


def test_a_torch_sinkhorn_converts_matches_and_builds() -> None:
    torch.manual_seed(0)
    model = Sinkhorn().eval()
    x = torch.randn(2, 3, 8)
    converted = pipeline.convert(model, x)
    assert "ReduceSum" not in ops(converted.onnx)
    torch.testing.assert_close(converted(x), model(x), rtol=1e-5, atol=1e-6)
    assert_builds(converted)
