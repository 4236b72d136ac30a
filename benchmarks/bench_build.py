"""Benchmark TensorRT-RTX engine builds on the CPU (ahead-of-time, no GPU) beside the export, per test model.

For each model (random weights, from torch / transformers configs): the export time (``pipeline.exporting.stage``), the
final graph (the default passes, fp32), then TensorRT-RTX's real parser and builder through the backend's build
code (``pipeline.compatibility.real.parse_with(..., build=True)``): parse seconds, build seconds and engine size, for
the default portable targets (8.0, 8.6, 8.9, 12.0+) and for one target (8.9). Each build is run ``--runs`` times; the
median is reported.

Run from the repository root::

    python benchmarks/bench_build.py                  # small configs (a minute or two)
    python benchmarks/bench_build.py --size base      # ResNet-50-like, BERT-base, GPT-2 small, ViT-base widths
    python benchmarks/bench_build.py --json build.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import pipeline
from converters.settings import Settings
from pipeline.compatibility.real import parse_with

Model = tuple[nn.Module, Any]


class Block(nn.Module):
    """A ResNet basic block (two 3x3 convolutions with batch norm and a residual)."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.skip = nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


def small_cnn(size: str) -> Model:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    return model.eval(), torch.randn(1, 3, 64, 64)


def resnet(size: str) -> Model:
    width, blocks = (64, 4) if size == "base" else (16, 3)
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    channels = width
    for i in range(blocks):
        stride = 1 if i == 0 else 2
        layers.append(Block(channels, stride))
        channels *= stride
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 1000)]
    side = 224 if size == "base" else 96
    return nn.Sequential(*layers).eval(), torch.randn(1, 3, side, side)


def _widths(size: str) -> dict[str, int]:
    if size == "base":
        return {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768, "intermediate_size": 3072}
    return {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 128, "intermediate_size": 512}


def vit(size: str) -> Model:
    import transformers

    config = transformers.ViTConfig(image_size=224 if size == "base" else 64, patch_size=16, **_widths(size))
    return transformers.ViTModel(config).eval(), torch.randn(1, 3, config.image_size, config.image_size)


def bert(size: str) -> Model:
    import transformers

    model = transformers.BertModel(transformers.BertConfig(**_widths(size))).eval()
    ids = torch.randint(0, 1000, (1, 128))
    return model, ((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def gpt2(size: str) -> Model:
    import transformers

    w = _widths(size)
    config = transformers.GPT2Config(
        n_embd=w["hidden_size"], n_layer=w["num_hidden_layers"], n_head=w["num_attention_heads"], use_cache=False
    )
    return transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 1000, (1, 128))


MODELS: dict[str, Callable[[str], Model]] = {
    "small CNN": small_cnn,
    "ResNet-style": resnet,
    "ViT": vit,
    "BERT": bert,
    "GPT-2": gpt2,
}


def measure(name: str, size: str, runs: int) -> dict[str, Any]:
    """Export, final graph, then TensorRT-RTX parse + build ``runs`` times per target set."""
    torch.manual_seed(0)
    model, sample = MODELS[name](size)
    module = pipeline.convert(model, sample, backend="onnxruntime", validate=False, check_parser="static")
    stages = dict(module.report.stages)
    row: dict[str, Any] = {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "export_s": stages["export"],
        "passes_s": stages["passes"],
        "onnx_mb": module.onnx.ByteSize() / 1e6,
        "nodes": len(module.onnx.graph.node),
    }
    for label, targets in (("portable", ()), ("sm89", ("8.9",))):
        settings = Settings(trt_compute_capabilities=targets)
        verdicts = [parse_with(module.onnx, "tensorrt-rtx", build=True, settings=settings) for _ in range(runs)]
        failed = next((v for v in verdicts if not v.built), None)
        if failed is not None:
            row[f"{label}_error"] = failed.build_error or "; ".join(f.message for f in failed.failures)
            continue
        row[f"{label}_parse_s"] = statistics.median(v.parse_seconds for v in verdicts)
        row[f"{label}_build_s"] = statistics.median(v.build_seconds or 0.0 for v in verdicts)
        row[f"{label}_engine_mb"] = len(verdicts[0].engine or b"") / 1e6
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """The README's markdown table."""
    lines = [
        "| model | params | nodes | export s | RTX parse s | RTX build s (portable) | engine MB (portable) "
        "| RTX build s (8.9) | engine MB (8.9) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "portable_error" in r:
            lines.append(
                f"| {r['model']} | {r['parameters'] / 1e6:.1f} M | {r['nodes']} | {r['export_s']:.1f} | "
                f"build failed: {r['portable_error'][:80]} | | | | |"
            )
            continue
        lines.append(
            f"| {r['model']} | {r['parameters'] / 1e6:.1f} M | {r['nodes']} | {r['export_s']:.1f} | "
            f"{r['portable_parse_s']:.2f} | {r['portable_build_s']:.2f} | {r['portable_engine_mb']:.1f} | "
            f"{r.get('sm89_build_s', float('nan')):.2f} | {r.get('sm89_engine_mb', float('nan')):.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["small", "base"], default="small")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    logging.getLogger("polygraphy").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR  # Polygraphy prints every builder config at INFO
    import tensorrt_rtx

    rows = [measure(name, args.size, args.runs) for name in args.models]
    print(
        f"\nTensorRT-RTX {tensorrt_rtx.__version__}, {args.size} configs, median of {args.runs} builds; "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), load {os.getloadavg()[0]:.1f}\n"
    )
    print(table(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
