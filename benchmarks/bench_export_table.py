"""What keeping the exporter's translation table saves per conversion (``pipeline/exporting/translation_table.py``).

Each round converts every model twice with ``pipeline.convert`` (ONNX Runtime backend, validation on): once after
``forget_tables()`` (the exporter builds its table of ATen translations, as every export did before) and once with
the table kept, in alternating order; the medians and their ratio are printed per model. Models: a one-op module
(the converter-case shape of the test suite), a small CNN, and a 2-layer BERT from a config (random weights).

Run from the repository root::

    python benchmarks/bench_export_table.py --rounds 5
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))

import pipeline  # noqa: E402
from pipeline.exporting.translation_table import forget_tables  # noqa: E402


def one_op() -> tuple[nn.Module, Any]:
    """torch.sin: a converter case's size."""

    class Sin(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sin(x)

    return Sin(), torch.randn(4, 5)


def cnn() -> tuple[nn.Module, Any]:
    """Three conv-bn-relu blocks and a linear head on 32x32."""
    layers: list[nn.Module] = []
    for cin, cout in ((3, 16), (16, 32), (32, 64)):
        layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(64 * 16, 10)), torch.randn(1, 3, 32, 32)


def bert() -> tuple[nn.Module, Any]:
    """transformers' BertModel, 2 layers, hidden 64."""
    import tests_environment  # noqa: F401  (torchvision's op schemas before transformers imports it)
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    return BertModel(config), torch.randint(0, 100, (1, 16))


MODELS: dict[str, Callable[[], tuple[nn.Module, Any]]] = {"one-op": one_op, "cnn": cnn, "bert-2l": bert}


def timed_convert(model: nn.Module, sample: Any, forget: bool) -> float:
    """Seconds of one ``pipeline.convert``; with ``forget`` the exporter builds its table first, as it used to."""
    if forget:
        forget_tables()
    start = time.perf_counter()
    pipeline.convert(model, sample)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Alternate built and kept tables per model and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}; {args.rounds} rounds, medians in seconds")
    print("| model | table built each export | table kept | saved | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, build in MODELS.items():
        model, sample = build()
        model.eval()
        timed_convert(model, sample, forget=False)  # warm-up: imports, first table
        times: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(args.rounds):
            for forget in (True, False) if round_ % 2 == 0 else (False, True):
                times[forget].append(timed_convert(model, sample, forget))
        built, kept = statistics.median(times[True]), statistics.median(times[False])
        print(f"| {name} | {built:.2f} | {kept:.2f} | {built - kept:.2f} | {built / kept:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
