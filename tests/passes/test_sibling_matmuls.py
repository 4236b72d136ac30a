"""Sibling projections (q/k/v, gate/up) as one MatMul and a Split: on a real export, the same numbers on ONNX Runtime,
what is left alone, and the real TensorRT-RTX builder taking the result."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch
from rtx_build import assert_builds

import pipeline
from converters.settings import Settings
from passes.sibling_matmuls import MergeSiblingMatMuls


class Block(torch.nn.Module):
    """Attention-style projections of one input (with and without bias), a gated MLP, and one Linear of another
    width (K) that must stay alone."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(32, 32, bias=False)
        self.k = torch.nn.Linear(32, 16, bias=False)
        self.v = torch.nn.Linear(32, 16, bias=True)
        self.gate = torch.nn.Linear(32, 48, bias=False)
        self.up = torch.nn.Linear(32, 48, bias=False)
        self.down = torch.nn.Linear(48, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.q(x) + torch.cat([self.k(x), self.v(x)], dim=-1)
        hidden = torch.nn.functional.silu(self.gate(mixed)) * self.up(mixed)
        return self.down(hidden)


def ops(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def test_projections_of_one_input_become_one_matmul_with_the_same_outputs() -> None:
    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 5, 32)
    module = pipeline.convert(block, x)
    counts = ops(module.onnx)
    assert counts["MatMul"] == 3  # q|k|v, gate|up, down
    assert counts["Split"] == 2
    widths = sorted(
        tuple(onnx.numpy_helper.to_array(t).shape) for t in module.onnx.graph.initializer if t.name.endswith("/weight")
    )
    assert widths == [(32, 64), (32, 96)]
    torch.testing.assert_close(module(x), block(x), rtol=1e-5, atol=1e-5)
    assert_builds(module)


def test_weights_of_another_dtype_or_width_stay_apart() -> None:
    x = gs.Variable("x", np.float32, (2, 8))
    rng = np.random.default_rng(0)
    weights = {
        "a": gs.Constant("a", rng.standard_normal((8, 4)).astype(np.float32)),
        "b": gs.Constant("b", rng.standard_normal((8, 4)).astype(np.float16)),  # another dtype
        "c": gs.Constant("c", rng.standard_normal((4, 4)).astype(np.float32)),  # another K (not x's width)
    }
    outputs = []
    nodes = []
    for name, weight in weights.items():
        out = gs.Variable(f"y_{name}", dtype=weight.dtype)
        nodes.append(gs.Node("MatMul", name=name, inputs=[x, weight], outputs=[out]))
        outputs.append(out)
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=outputs)
    result = MergeSiblingMatMuls()(graph, Settings())
    assert not result.modified
    assert [n.op for n in graph.nodes] == ["MatMul"] * 3
