"""Benchmark TensorRT segments (``fallback="onnxruntime"``) on real models with an op TensorRT-RTX rejects.

Each model is a torchvision / transformers architecture (random weights) with a data-dependent step its users write
(scores above a threshold: NonZero; the distinct predicted classes: Unique). It is converted with
``backend="tensorrt-rtx"``: the segments, the share of MatMul/Gemm/Conv FLOPs inside TensorRT, the build stage's
seconds (partition, profiles, the real parses and builds). Then per-call latency on this CPU of the segmented module
(each TensorRT-RTX engine run by its ONNX Runtime stand-in) against the same final graph whole on ONNX Runtime,
timed interleaved: the price of the segment boundaries on the CPU (not the GPU's; no engine runs here).

Run from the repository root::

    python benchmarks/bench_segments.py [--iterations 50] [--json segments.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the repository first: with an editable install tests/pipeline (a test folder, no __init__) would otherwise be
# taken as a namespace package `pipeline` before the install's finder is asked
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
import tests_environment  # noqa: E402,F401 -- torchvision's operator schemas, before torchvision is imported
import torch  # noqa: E402
from torch import nn  # noqa: E402

import pipeline  # noqa: E402


class ScoresAbove(nn.Module):
    """A classifier whose second output is the sum of the probabilities above 0.01 (NonZero)."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.body(x)
        probs = torch.softmax(logits, -1)
        return logits, probs[probs > 0.01].sum()


class DistinctTokens(nn.Module):
    """A token classifier returning its logits and how many distinct classes it predicts (Unique)."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.body(input_ids=ids).logits
        return logits, torch.unique(logits.argmax(-1)).numel() * torch.ones(1)


def resnet18() -> tuple[nn.Module, Any]:
    import torchvision

    return ScoresAbove(torchvision.models.resnet18(weights=None)).eval(), torch.randn(1, 3, 112, 112)


def bert_tokens() -> tuple[nn.Module, Any]:
    from transformers import BertConfig, BertForTokenClassification

    config = BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, num_labels=9
    )
    return DistinctTokens(BertForTokenClassification(config)).eval(), torch.randint(0, 1000, (1, 32))


MODELS: dict[str, Callable[[], tuple[nn.Module, Any]]] = {"resnet18+NonZero": resnet18, "bert+Unique": bert_tokens}


def median_ms(call: Callable[[], Any], others: list[Callable[[], Any]], iterations: int) -> list[float]:
    """Median milliseconds of each of ``[call, *others]``, timed interleaved."""
    calls = [call, *others]
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(iterations):
        for i, fn in enumerate(calls):
            start = time.perf_counter()
            fn()
            times[i].append((time.perf_counter() - start) * 1e3)
    return [statistics.median(t) for t in times]


def measure(name: str, iterations: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model, sample = MODELS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = pipeline.convert(model, sample, backend="tensorrt-rtx", trt_engine_cache=False)
        whole = pipeline.convert(model, sample, backend="onnxruntime")
    report = module.report.segments
    assert report is not None and module.report.accuracy is not None and module.report.accuracy.passed
    stages = dict(module.report.stages)
    with torch.no_grad():
        segmented_ms, whole_ms = median_ms(lambda: module(sample), [lambda: whole(sample)], iterations)
    return {
        "model": name,
        "nodes": report.total_nodes,
        "segments": [f"{s.kind}:{s.nodes}" for s in report.segments],
        "left_out": report.left_out_ops(),
        "share_in_tensorrt": report.share,
        "build_seconds": stages["build"],
        "segmented_ms": segmented_ms,
        "whole_onnxruntime_ms": whole_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.getLogger("pipeline").setLevel(logging.ERROR)
    rows = [measure(name, args.iterations) for name in MODELS]
    print(
        "| model | nodes | segments (kind:nodes) | left out | FLOPs in TensorRT | build s | segmented ms "
        "| whole ORT ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['nodes']} | {' '.join(r['segments'])} | {r['left_out']} | "
            f"{r['share_in_tensorrt']:.1%} | {r['build_seconds']:.1f} | {r['segmented_ms']:.2f} | "
            f"{r['whole_onnxruntime_ms']:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
