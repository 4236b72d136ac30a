"""Plan and artifact sizes with and without ``strip_weights``, built by TensorRT-RTX, on three models.

Each model (random weights, from a transformers config or defined here) is converted once to its final graph (ONNX
Runtime, fp32, no validation); then TensorRT-RTX's builder, through the backend's build code
(``pipeline.backends.tensorrt.build.build_engine``), builds the plan with the default settings and with
``strip_weights=True``, and each is written as an artifact (``pipeline.runtime.artifact.save_artifact``, what
``module.save`` writes). A build the builder refuses is reported with its error (TensorRT-RTX 1.7.1's CPU-only builder
refuses weight-stripped and refittable plans, measured: see README "Engine options"); the ONNX-only artifact (no
engine) is the floor a stripped artifact can reach, so its ratio to the unstripped artifact is printed too.

Run from the repository root (BERT-base takes a few minutes on 2 cores)::

    python benchmarks/bench_engine_options.py
    python benchmarks/bench_engine_options.py --models cnn bert-small --json sizes.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import tests_environment  # noqa: E402, F401 -- torchvision's operator schemas, before transformers imports it

import pipeline  # noqa: E402
from converters.errors import BuildError  # noqa: E402
from converters.settings import Settings  # noqa: E402
from pipeline.backends.tensorrt.build import build_engine  # noqa: E402
from pipeline.runtime.artifact import save_artifact  # noqa: E402
from pipeline.runtime.tensorrt.library import TENSORRT_RTX  # noqa: E402

Model = tuple[nn.Module, Any]


def cnn() -> Model:
    """A ResNet-18-width CNN (11 M parameters) on a 1x3x224x224 image."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    channels = 64
    for width in (64, 128, 256, 512):
        for stride in (1 if width == 64 else 2, 1):
            layers += [nn.Conv2d(channels, width, 3, stride, 1), nn.BatchNorm2d(width), nn.ReLU()]
            layers += [nn.Conv2d(width, width, 3, 1, 1), nn.BatchNorm2d(width), nn.ReLU()]
            channels = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers).eval(), torch.randn(1, 3, 224, 224)


def bert(hidden: int, layers: int, heads: int) -> Callable[[], Model]:
    def make() -> Model:
        import transformers

        config = transformers.BertConfig(
            hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden
        )
        ids = torch.randint(0, config.vocab_size, (1, 128))
        return transformers.BertModel(config).eval(), ((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    return make


def gpt2_small() -> Model:
    """GPT-2 small's configuration (124 M parameters), no cache, 64 tokens."""
    import transformers

    config = transformers.GPT2Config(use_cache=False)
    ids = torch.randint(0, config.vocab_size, (1, 64))
    return transformers.GPT2LMHeadModel(config).eval(), ((), {"input_ids": ids})


MODELS: dict[str, Callable[[], Model]] = {
    "cnn": cnn,
    "gpt2-small": gpt2_small,
    "bert-base": bert(768, 12, 12),
    "bert-small": bert(256, 4, 4),
}


def measure(name: str, make: Callable[[], Model], directory: Path) -> dict[str, Any]:
    """Sizes in bytes of the final graph, the plans and the artifacts of one model (stripped: or why not)."""
    torch.manual_seed(0)
    model, sample = make()
    module = pipeline.convert(model, sample, backend="onnxruntime", validate=False, trt_engine_cache=False)
    onnx_only = module.save(directory / f"{name}-onnx.ptrt").stat().st_size
    row: dict[str, Any] = {"model": name, "parameters": sum(p.numel() for p in model.parameters())}
    row["onnx_artifact"] = onnx_only
    for label, options in (("plain", {}), ("stripped", {"strip_weights": True})):
        settings = Settings(backend="tensorrt-rtx", validate=False, **options)  # type: ignore[arg-type]
        try:
            plan = build_engine(module.onnx, module.io, settings, None, library=TENSORRT_RTX)
        except BuildError as exc:
            row[f"{label}_plan"] = None
            row[f"{label}_refused"] = str(exc).splitlines()[0]
            continue
        path = save_artifact(
            directory / f"{name}-{label}.ptrt",
            onnx_model=module.onnx,
            engine=plan,
            backend="tensorrt-rtx",
            io=module.io,
            settings=settings,
            report=module.report,
        )
        row[f"{label}_plan"], row[f"{label}_artifact"] = len(plan), path.stat().st_size
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table (MB = 10^6 bytes)."""

    def mb(value: int | None) -> str:
        return "refused here" if value is None else f"{value / 1e6:.1f}"

    lines = [
        "| model | parameters | plan | artifact | stripped plan | stripped artifact | stripped / plain | "
        "ONNX-only artifact / plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        plain = r.get("plain_artifact")
        stripped = r.get("stripped_artifact")
        ratio = f"{stripped / plain:.2f}x" if stripped and plain else "-"
        floor = f"{r['onnx_artifact'] / plain:.2f}x" if plain else "-"
        lines.append(
            f"| {r['model']} | {r['parameters'] / 1e6:.1f} M | {mb(r['plain_plan'])} | {mb(plain)} | "
            f"{mb(r['stripped_plan'])} | {mb(stripped)} | {ratio} | {floor} |"
        )
    refusals = {r.get("stripped_refused") for r in rows} - {None}
    return "\n".join(lines + [f"\nstripped build refused: {reason}" for reason in sorted(refusals)])


def main() -> None:
    """Measure the chosen models and print the table (and write JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["cnn", "gpt2-small", "bert-base"], choices=sorted(MODELS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for name in args.models:
            rows.append(measure(name, MODELS[name], Path(directory)))
            print(f"{name}: {rows[-1]}", flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
