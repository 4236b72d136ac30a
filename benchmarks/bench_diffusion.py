"""Diffusion on ONNX Runtime's CPU provider against PyTorch eager: per-step denoiser latency and whole-pipeline time.

Pipelines (nothing downloaded; ``tests/diffusion_models.py``): a Stable-Diffusion-style one (UNet2DConditionModel,
AutoencoderKL, DDIM, classifier-free guidance) and a Flux-style one (FluxTransformer2DModel, AutoencoderKL,
flow-matching Euler), with random weights, at two sizes (``--scales 1 2``: scale 2 doubles the image side and the
denoiser's width). The denoiser and the VAE decoder are swapped for ``pipeline.on_first_call`` modules (fp32,
ONNX Runtime); the conversion happens on a warm-up run and is timed apart. Per-step latency: the denoiser called on
the pipeline's own step inputs, eager and converted in turn each round (a busy machine slows both alike), medians.
Whole pipeline: 10 steps, eager and converted in turn, medians. ``--rtx`` adds TensorRT-RTX's CPU-only build time of
each converted denoiser and decoder graph (fp32 and fp16).

    python benchmarks/bench_diffusion.py                   # both pipelines, scales 1 and 2, 20 rounds
    python benchmarks/bench_diffusion.py --rounds 5 --pipelines flux --scales 1 --rtx --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from diffusion_models import PIPELINES, denoiser_name, generate  # noqa: E402

import pipeline  # noqa: E402


class Recorder(torch.nn.Module):
    """The denoiser, recording the arguments of its first call (a real step's inputs)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.call: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Record the first call, then run the denoiser."""
        if self.call is None:
            self.call = (args, kwargs)
        return self.inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)


def _median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 2)


def measure(kind: str, scale: int, rounds: int, steps: int, rtx: bool) -> dict[str, Any]:
    """One pipeline at one size: per-step and whole-pipeline medians, eager against converted."""
    pipe, call = PIPELINES[kind](scale)
    name = denoiser_name(pipe)
    eager_denoiser, eager_decode = getattr(pipe, name), pipe.vae.decode
    recorder = Recorder(eager_denoiser)
    setattr(pipe, name, recorder)
    generate(pipe, call, steps=1)
    assert recorder.call is not None
    args, kwargs = recorder.call
    batch = ("batch", 1, 2, 4)
    dynamic = {"sample": {0: batch}, "encoder_hidden_states": {0: batch}} if name == "unet" else {}
    converted = pipeline.on_first_call(eager_denoiser, dynamic=dynamic)
    start = time.perf_counter()
    setattr(pipe, name, converted)
    pipe.vae.decode = pipeline.on_first_call(eager_decode)
    generate(pipe, call, steps=1)  # converts both
    convert_s = time.perf_counter() - start
    converted_decode = pipe.vae.decode
    step_eager: list[float] = []
    step_conv: list[float] = []
    with torch.inference_mode():
        for _ in range(rounds):
            for runner, out in ((eager_denoiser, step_eager), (converted, step_conv)):
                t0 = time.perf_counter()
                runner(*args, **kwargs)
                out.append(time.perf_counter() - t0)
    pipe_eager: list[float] = []
    pipe_conv: list[float] = []
    for _ in range(max(1, rounds // 5)):
        for denoiser, decode, out in (
            (eager_denoiser, eager_decode, pipe_eager),
            (converted, converted_decode, pipe_conv),
        ):
            setattr(pipe, name, denoiser)
            pipe.vae.decode = decode
            t0 = time.perf_counter()
            generate(pipe, call, steps=steps)
            out.append(time.perf_counter() - t0)
    row = {
        "pipeline": kind,
        "scale": scale,
        "image": f"{call['height']}x{call['width']}",
        "denoiser_params_M": round(sum(p.numel() for p in eager_denoiser.parameters()) / 1e6, 2),
        "step_eager_ms": _median_ms(step_eager),
        "step_onnxruntime_ms": _median_ms(step_conv),
        "step_speedup": round(statistics.median(step_eager) / statistics.median(step_conv), 2),
        "pipeline_eager_ms": _median_ms(pipe_eager),
        "pipeline_onnxruntime_ms": _median_ms(pipe_conv),
        "pipeline_speedup": round(statistics.median(pipe_eager) / statistics.median(pipe_conv), 2),
        "first_call_convert_s": round(convert_s, 1),
    }
    if rtx:
        for part, module in (("denoiser", converted.converted), ("decoder", converted_decode.conversions[-1])):
            row[f"rtx_build_{part}_s"] = rtx_build_seconds(module)
    return row


def rtx_build_seconds(module: pipeline.ConvertedModule) -> float | str:
    """TensorRT-RTX's CPU-only build time of the module's final graph, or the reason it failed."""
    from pipeline.precision.buildable import build_error

    start = time.perf_counter()
    error = build_error(module.onnx, module.settings.dynamic)
    return round(time.perf_counter() - start, 1) if error is None else f"failed: {error[:200]}"


def main() -> None:
    """Measure and print one JSON row per pipeline and size (and write them with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipelines", nargs="+", default=sorted(PIPELINES), choices=sorted(PIPELINES))
    parser.add_argument("--scales", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=20, help="per-step rounds (whole-pipeline rounds: a fifth)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (ONNX Runtime's default)")
    parser.add_argument("--rtx", action="store_true", help="TensorRT-RTX build times of the converted graphs")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    rows = []
    for kind in options.pipelines:
        for scale in options.scales:
            rows.append(measure(kind, scale, options.rounds, options.steps, options.rtx))
            print(json.dumps(rows[-1]), flush=True)
    if options.json:
        options.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
