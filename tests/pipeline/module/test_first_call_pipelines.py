"""A Stable-Diffusion-style and a Flux-style pipeline from tiny components with random weights, their denoiser and
VAE decoder swapped for ``pipeline.on_first_call`` ones, give the eager pipeline's images after 10 steps (same seed,
same scheduler): PSNR >= 40 dB in fp32, >= 30 dB in fp16 (the Stable-Diffusion one in fp32, its UNet without the
middle block, the Flux one in fp16)."""

from __future__ import annotations

import pytest
from diffusion_models import PIPELINES, denoiser_name, generate, psnr, stable_diffusion

import pipeline

GOAL_DB = {"fp32": 40.0, "fp16": 30.0}


# one precision per pipeline keeps the suite's time budget: the other two pairs were measured once (README table)
@pytest.mark.parametrize(("kind", "precision"), [("stable_diffusion", "fp32"), ("flux", "fp16")])
def test_converted_denoiser_and_decoder_give_the_eager_images(kind: str, precision: str) -> None:
    pipe, call = stable_diffusion(1, mid_block=False) if kind == "stable_diffusion" else PIPELINES[kind](1)
    want = generate(pipe, call)
    name = denoiser_name(pipe)
    batch = ("batch", 1, 2, 4)  # classifier-free guidance doubles the UNet's batch
    dynamic = {"sample": {0: batch}, "encoder_hidden_states": {0: batch}} if name == "unet" else {}
    # validate=False: the images after 10 steps are the check here (validation would add a third of the time)
    options = {"precision": precision, "validate": False}
    setattr(pipe, name, pipeline.on_first_call(getattr(pipe, name), dynamic=dynamic, **options))
    pipe.vae.decode = pipeline.on_first_call(pipe.vae.decode, **options)
    got = generate(pipe, call)
    assert got.shape == want.shape
    print(f"{kind} {precision}: PSNR {psnr(got, want):.1f} dB")  # pytest -s shows it (README table)
    assert psnr(got, want) >= GOAL_DB[precision], f"{kind} {precision}: {psnr(got, want):.1f} dB"
    denoiser = getattr(pipe, name)
    assert len(denoiser.conversions) == 1 and len(pipe.vae.decode.conversions) == 1  # converted once, 10 steps run
    assert denoiser.converted.report.precision is not None or precision == "fp32"
