"""User passes at named points of the default list, and the debug mode that names a wrong pass."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
import torch
from torch import nn

import pipeline
from converters.settings import Settings
from passes import PassResult, default_passes, insert_passes


class Recorder:
    """Records the ops it sees; placed after constant folding it must see a folded graph."""

    def __init__(self, name: str = "recorder") -> None:
        self.name = name
        self.seen: list[list[str]] = []

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        self.seen.append([n.op for n in graph.nodes])
        return PassResult(graph, False)


class FoldMe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((64, 1024), 0.5))  # large: the exporter leaves it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.scale.exp() + 1.0)  # exp and add of a constant: folded by fold_constants


def test_user_pass_after_constant_folding_runs_there() -> None:
    before, after = Recorder("before_fold"), Recorder("after_fold")
    pipeline.convert(
        FoldMe(),
        torch.randn(2, 64, 1024),
        backend="onnxruntime",
        extra_passes=[("before", "fold_constants", before), ("after", "fold_constants", after)],
    )
    assert "Exp" in before.seen[0]
    assert after.seen[0] == ["Mul"]


def test_placement_at_an_unknown_pass_lists_the_names() -> None:
    with pytest.raises(pipeline.ConversionError, match=r"(?s)cannot place pass 'r' 'after' 'fold'.*fold_constants"):
        insert_passes(default_passes(), [("after", "fold", Recorder("r"))])


class Sabotage:
    """A deliberately wrong pass: turns every Relu into a Sigmoid."""

    name = "sabotage"

    def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
        changed = False
        for node in graph.nodes:
            if node.op == "Relu":
                node.op, changed = "Sigmoid", True
        return PassResult(graph, changed)


def test_debug_mode_names_the_wrong_pass() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    with pytest.raises(pipeline.ConversionError, match=r"pass 'sabotage' \(iteration 0\) changed output 'out'"):
        pipeline.convert(
            model,
            torch.randn(3, 4),
            backend="onnxruntime",
            debug_passes=True,
            extra_passes=[("after", "remove_identities", Sabotage())],
        )


def test_debug_mode_passes_a_correct_pipeline() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    module = pipeline.convert(model, torch.randn(3, 4), backend="onnxruntime", debug_passes=True)
    x = torch.randn(3, 4)
    np.testing.assert_allclose(module(x).numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_debug_mode_with_a_custom_op_checks_against_pytorch() -> None:
    """The exported graph holds an opaque node no runtime can run: the debugger's reference is PyTorch."""
    from tests_support_custom_op import CLAMP_REGISTRY, UsesClamp

    module = pipeline.convert(
        UsesClamp(), torch.randn(3, 4), converters=CLAMP_REGISTRY, backend="onnxruntime", debug_passes=True
    )
    x = torch.randn(3, 4)
    torch.testing.assert_close(module(x), UsesClamp()(x))
