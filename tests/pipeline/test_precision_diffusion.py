"""Diffusion models in low precision: a UNet in FP8 W8A8 (the quantize stage) converts, matches by the accuracy
policy and builds with TensorRT-RTX for an SM89 target; the CLIP text encoder in bf16 converts and builds.
The measured table (UNet, Flux, CLIP, T5 in fp16/bf16/fp8) is in the README's diffusion section."""

from __future__ import annotations

import torch
from diffusion_models import clip_text_encoder, tiny_unet
from quantize_support import build_with_tensorrt_rtx
from rtx_build import assert_builds

import pipeline


def test_a_unet_in_fp8_converts_and_builds_for_sm89() -> None:
    unet = tiny_unet()
    sample = ((torch.randn(2, 4, 8, 8), torch.tensor(10), torch.randn(2, 3, 8)), {"return_dict": False})
    module = pipeline.convert(unet, sample, precision="fp8")  # validated against PyTorch by the quantize policy
    report = module.report.quantization
    assert report is not None and report.share > 0.9, report.summary_lines() if report else None
    (got,), (want,) = module(*sample[0], **sample[1]), unet(*sample[0], **sample[1])
    assert float((got - want.detach()).norm() / want.norm()) < 0.2  # FP8 E4M3: a few percent per quantized input
    assert build_with_tensorrt_rtx(module.onnx, sm89=True) > 0  # FP8 builds only for compute capability >= 8.9


def test_the_clip_text_encoder_in_bf16_converts_and_builds() -> None:
    torch.manual_seed(0)
    model = clip_text_encoder(layers=1, bos_token_id=0, eos_token_id=2)  # T5 too in the README table (time budget)
    module = pipeline.convert(model, torch.randint(3, 1000, (1, 16)), precision="bf16")
    assert module.report.precision is not None and module.report.precision.precision == "bf16"
    assert module.report.accuracy is not None and module.report.accuracy.passed
    assert_builds(module)
