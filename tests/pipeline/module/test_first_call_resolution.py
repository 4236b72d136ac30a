"""Resolution as optimization profiles: a UNet and a VAE decoder swapped by ``pipeline.on_first_call`` with dynamic
latent height and width run at two resolutions from one conversion, matching eager; the UNet's sizes must be
multiples of 2 (found at export, said as a WARNING) and a call off them or outside the range is an InputError; the
TensorRT-RTX builder builds the UNet's graph with the two declared profiles (a 8x8- and a 16x16-latent class)."""

from __future__ import annotations

import logging

import pytest
import torch
from diffusion_models import tiny_unet
from rtx_build import assert_builds

import pipeline

SIZES = {2: ("height", 8, 8, 16), 3: ("width", 8, 8, 16)}
PROFILES = [{"height": (8, 8, 8), "width": (8, 8, 8)}, {"height": (16, 16, 16), "width": (16, 16, 16)}]


def test_a_unet_runs_two_resolutions_from_one_conversion(caplog: pytest.LogCaptureFixture) -> None:
    unet = tiny_unet()
    # validate=False: the test compares with eager itself, at both resolutions
    wrapped = pipeline.on_first_call(unet, dynamic={"sample": SIZES}, profiles=PROFILES, validate=False)
    text, step = torch.randn(1, 3, 8), torch.tensor(10)
    with caplog.at_level(logging.WARNING):
        for size in (8, 16):
            latents = torch.randn(1, 4, size, size)
            (got,) = wrapped(latents, step, encoder_hidden_states=text, return_dict=False)
            with torch.no_grad():
                torch.testing.assert_close(got, unet(latents, step, text, return_dict=False)[0])
    assert len(wrapped.conversions) == 1
    assert "'height' a multiple of 2" in caplog.text
    assert {d.name: d.multiple for d in wrapped.converted.settings.dynamic} == {"height": 2, "width": 2}
    with pytest.raises(pipeline.InputError, match=r"size 9 on axis 2 of 'sample', not a multiple of 2"):
        wrapped(torch.randn(1, 4, 9, 9), step, encoder_hidden_states=text, return_dict=False)
    with pytest.raises(pipeline.InputError, match=r"size 32 on axis 2 of 'sample', outside the declared range"):
        wrapped(torch.randn(1, 4, 32, 32), step, encoder_hidden_states=text, return_dict=False)
    assert len(wrapped.converted.settings.profiles) == 2
    assert_builds(wrapped.converted)  # both profiles given to TensorRT-RTX's builder


def test_a_vae_decoder_runs_two_resolutions_from_one_conversion() -> None:
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(4,),
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=False,
    ).eval()
    decode = vae.decode
    vae.decode = pipeline.on_first_call(vae.decode, dynamic={"z": SIZES}, validate=False)  # type: ignore[method-assign]
    for size in (8, 12):
        latents = torch.randn(1, 1, size, size)
        (got,) = vae.decode(latents, return_dict=False)
        with torch.no_grad():
            torch.testing.assert_close(got, decode(latents, return_dict=False)[0], atol=1e-4, rtol=1e-4)
    assert len(vae.decode.conversions) == 1
