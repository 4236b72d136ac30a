"""A Stable-Diffusion-style and a Flux-style pipeline from tiny components with random weights, their denoiser and
VAE decoder swapped for ``pipeline.on_first_call`` ones, give the eager pipeline's images after 10 steps (same seed,
same scheduler): PSNR >= 40 dB in fp32, >= 30 dB in fp16 (the Stable-Diffusion one in fp32, the Flux one in fp16)."""

from __future__ import annotations

import pytest
from diffusion_models import PIPELINES, denoiser_name, generate, psnr

import pipeline

GOAL_DB = {"fp32": 40.0, "fp16": 30.0}


# one precision per pipeline keeps the suite's time budget: the other two pairs were measured once (README table)
@pytest.mark.parametrize(("kind", "precision"), [("stable_diffusion", "fp32"), ("flux", "fp16")])
def test_converted_denoiser_and_decoder_give_the_eager_images(kind: str, precision: str) -> None:
    pipe, call = PIPELINES[kind](1)
    want = generate(pipe, call)
    name = denoiser_name(pipe)
    batch = ("batch", 1, 2, 4)  # classifier-free guidance doubles the UNet's batch
    dynamic = {"sample": {0: batch}, "encoder_hidden_states": {0: batch}} if name == "unet" else {}
    setattr(pipe, name, pipeline.on_first_call(getattr(pipe, name), precision=precision, dynamic=dynamic))
    pipe.vae.decode = pipeline.on_first_call(pipe.vae.decode, precision=precision)
    got = generate(pipe, call)
    assert got.shape == want.shape
    assert psnr(got, want) >= GOAL_DB[precision], f"{kind} {precision}: {psnr(got, want):.1f} dB"
    denoiser = getattr(pipe, name)
    assert len(denoiser.conversions) == 1 and len(pipe.vae.decode.conversions) == 1  # converted once, 10 steps run
    assert denoiser.converted.report.precision is not None or precision == "fp32"
