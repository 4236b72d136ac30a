"""The exporter's type-promotion pass, reusing torch.export's recorded values, writes the graph it writes when it runs
every node again (pipeline.exporting.type_promotion)."""

from __future__ import annotations

import contextlib

import pytest
import tiny_models
import torch

import pipeline
from pipeline.exporting import patch_stack, type_promotion


class _Mixed(torch.nn.Module):
    """Ops whose inputs PyTorch promotes implicitly: integers with floats, half with float, booleans with integers."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("steps", torch.arange(4))  # int64

    def forward(self, x: torch.Tensor, ids: torch.Tensor, half: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.proj(x) + ids.unsqueeze(-1)  # float32 + int64
        ratio = ids / (ids.sum(-1, keepdim=True) + 1)  # int64 / int64: a float
        scaled = half * x  # float16 * float32
        flags = (x > 0) + self.steps  # bool + int64
        picked = torch.where(x > 0, ids.unsqueeze(-1), x)  # int64 and float32 branches
        powered = torch.pow(self.steps, 0.5) * y  # int64 ** float
        return y, ratio, scaled, flags, picked, powered


def _graph_and_outputs(model: torch.nn.Module, sample: tuple, dynamic: dict | None) -> tuple[list, tuple]:
    module = pipeline.convert(model, sample, dynamic=dynamic or {}, validate=False)
    graph = [(n.op_type, n.domain, list(n.input), [str(a) for a in n.attribute]) for n in module.onnx.graph.node]
    outputs = module(*sample)
    return graph, outputs if isinstance(outputs, tuple) else (outputs.logits,)


def _both_ways(model: torch.nn.Module, sample: tuple, dynamic: dict | None, monkeypatch) -> tuple:
    fast = _graph_and_outputs(model, sample, dynamic)
    monkeypatch.setattr(patch_stack, "fast_type_promotion", contextlib.nullcontext)
    return fast, _graph_and_outputs(model, sample, dynamic)


def test_the_pass_is_replaced_for_this_pytorch() -> None:
    from torch.onnx._internal.fx.passes.type_promotion import _TypePromotionInterpreter

    original = _TypePromotionInterpreter.run_node
    with type_promotion.fast_type_promotion():
        assert _TypePromotionInterpreter.run_node is not original
    assert _TypePromotionInterpreter.run_node is original


@pytest.mark.parametrize("dynamic", [None, {name: {0: ("batch", 1, 2, 8)} for name in ("x", "ids", "half")}])
def test_mixed_types_give_the_same_graph_and_values_as_the_full_pass(dynamic, monkeypatch) -> None:
    torch.manual_seed(0)
    x, ids = torch.randn(2, 3, 4), torch.randint(0, 5, (2, 3))
    sample = (x, ids, torch.randn(2, 3, 4).half())
    (fast, fast_out), (full, full_out) = _both_ways(_Mixed().eval(), sample, dynamic, monkeypatch)
    assert any(op == "Cast" for op, *_ in fast)  # promotions were written
    assert fast == full
    for got, want in zip(fast_out, full_out, strict=True):
        assert torch.equal(got, want)


def test_a_causal_lm_gives_the_same_graph_as_the_full_pass(monkeypatch) -> None:
    model = tiny_models.tiny_llama()
    ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    (fast, fast_out), (full, full_out) = _both_ways(model, (ids,), None, monkeypatch)
    assert fast == full
    assert torch.equal(fast_out[0], full_out[0])
