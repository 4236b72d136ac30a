"""The fp16 compute share counts FLOPs at the declared opt shape: a dynamic BERT reports what the same model
exported at that shape reports (the exporter names intermediate dimensions itself, ``s0*s1``, so the dynamic
dimensions' names alone do not reach the MatMuls)."""

from __future__ import annotations

import pytest
import torch
from model_zoo import bert_inputs, tiny_bert_config

import pipeline
from passes.precision.types import LOW_TYPES
from pipeline.precision.share import compute_share

transformers = pytest.importorskip("transformers")

NAMES = ("input_ids", "attention_mask", "token_type_ids")


def bert() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.BertModel(tiny_bert_config(hidden_size=128, intermediate_size=256)).eval()


def expected_flops(batch: int, seq: int, hidden: int = 128, inner: int = 256, heads: int = 2, layers: int = 2) -> float:
    """MatMul FLOPs of a BERT encoder by hand: Q, K, V and output projections, the two attention products, the
    feed-forward pair, then the pooler's Gemm on the first token."""
    tokens = batch * seq
    projections = 4 * 2 * tokens * hidden * hidden
    attention = 2 * 2 * batch * heads * seq * seq * (hidden // heads)
    feed_forward = 2 * 2 * tokens * hidden * inner
    return layers * (projections + attention + feed_forward) + 2 * batch * hidden * hidden


def test_dynamic_bert_counts_flops_at_the_opt_shape() -> None:
    model = bert()
    sample = ((), bert_inputs(2, 16, seed=0))
    dynamic = {name: {0: ("batch", 1, 2, 8), 1: ("seq", 4, 16, 32)} for name in NAMES}
    on_dynamic = pipeline.convert(model, sample, precision="fp16", dynamic=dynamic, validate=False)
    on_static = pipeline.convert(model, sample, precision="fp16", validate=False)
    dynamic_report, static_report = on_dynamic.report.precision, on_static.report.precision
    assert dynamic_report is not None and static_report is not None
    assert static_report.total_flops == pytest.approx(expected_flops(2, 16))
    assert dynamic_report.total_flops == pytest.approx(static_report.total_flops)
    assert dynamic_report.low_flops == pytest.approx(static_report.low_flops)
    assert dynamic_report.share == pytest.approx(static_report.share)
    assert f"{static_report.total_flops / 1e6:.3g} MFLOP" in on_dynamic.report.summary()


def test_flops_follow_the_opt_size_asked_for() -> None:
    """The same dynamic graph at opt batch 4 and sequence 32: the count the hand formula gives at that shape."""
    sample = ((), bert_inputs(2, 16, seed=0))
    dynamic = {name: {0: ("batch", 1, 2, 8), 1: ("seq", 4, 16, 32)} for name in NAMES}
    graph = pipeline.convert(bert(), sample, dynamic=dynamic, validate=False).onnx
    share = compute_share(graph, LOW_TYPES["fp16"], {"batch": 4, "seq": 32})
    assert share.total_flops == pytest.approx(expected_flops(4, 32))
    assert share.low_flops == 0.0 and share.share == 0.0  # a float32 graph: nothing in fp16
