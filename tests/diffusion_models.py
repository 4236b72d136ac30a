"""Tiny diffusers pipelines with random weights (no hub, no tokenizer: the prompt embeddings are given), shared by
the drop-in tests and benchmarks/bench_diffusion.py. ``scale`` widens the components for the benchmark's larger
size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tests_environment  # noqa: F401 -- torchvision's schemas before diffusers imports transformers' vision code
import torch

STEPS = 10


def stable_diffusion(scale: int = 1, mid_block: bool = True) -> tuple[Any, dict[str, Any]]:
    """A Stable-Diffusion-style pipeline (UNet2DConditionModel, AutoencoderKL, DDIM) and its call arguments;
    ``mid_block=False`` drops the UNet's middle block (a quarter of its layers: the end-to-end test's budget)."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8 * scale,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16 * scale, 32 * scale),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=8,
        norm_num_groups=8,
        mid_block_type="UNetMidBlock2DCrossAttn" if mid_block else None,
    ).eval()
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16 * scale,
    ).eval()
    scheduler = DDIMScheduler(num_train_timesteps=1000, steps_offset=1, clip_sample=False)
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    size = 16 * scale
    call = {"prompt_embeds": torch.randn(1, 7, 16), "negative_prompt_embeds": torch.randn(1, 7, 16)}
    return pipe, {**call, "height": size, "width": size}


def flux(scale: int = 1) -> tuple[Any, dict[str, Any]]:
    """A Flux-style pipeline (FluxTransformer2DModel, AutoencoderKL, flow-matching Euler) and its call arguments."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2 * scale,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    ).eval()
    vae = AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    ).eval()
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    size = 16 * scale
    call = {"prompt_embeds": torch.randn(1, 8, 32), "pooled_prompt_embeds": torch.randn(1, 32)}
    return pipe, {**call, "height": size, "width": size}


def tiny_unet() -> torch.nn.Module:
    """Two down and two up blocks (the latent halves once), no attention, no middle block: the smallest
    UNet2DConditionModel whose latent sizes the model constrains (multiples of 2)."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(4, 4),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        mid_block_type=None,
        cross_attention_dim=8,
        norm_num_groups=2,
    ).eval()


PIPELINES: dict[str, Callable[[int], tuple[Any, dict[str, Any]]]] = {"stable_diffusion": stable_diffusion, "flux": flux}


def generate(pipe: Any, call: dict[str, Any], steps: int = STEPS) -> np.ndarray:
    """The pipeline's images (float, [0, 1]) after ``steps`` steps, seeded: eager and converted runs compare."""
    generator = torch.Generator().manual_seed(0)
    images: np.ndarray = pipe(**call, num_inference_steps=steps, generator=generator, output_type="np").images
    return images


def psnr(got: np.ndarray, want: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two [0, 1] images in dB (inf when equal)."""
    mse = float(np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else float(10 * np.log10(1.0 / mse))


def denoiser_name(pipe: Any) -> str:
    """The pipeline's denoiser attribute: ``unet`` or ``transformer``."""
    return "unet" if hasattr(pipe, "unet") else "transformer"


def clip_text_encoder(layers: int, **config: Any) -> torch.nn.Module:
    """A tiny ``CLIPTextModel`` (vocabulary 1000, hidden 32, 77 positions) with ``layers`` layers, in eval mode;
    ``config`` overrides ``CLIPTextConfig`` fields (token ids, say)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    fields: dict[str, Any] = dict(
        vocab_size=1000, hidden_size=32, intermediate_size=37, num_attention_heads=4, max_position_embeddings=77
    )
    return CLIPTextModel(CLIPTextConfig(**(fields | config), num_hidden_layers=layers)).eval()


def components() -> dict[str, tuple[torch.nn.Module, Any]]:
    """Every model the diffusion goal lists, tiny, with a sample each: ``{name: (module, sample)}``."""
    from diffusers import DiTTransformer2DModel, SD3Transformer2DModel
    from transformers import T5Config, T5EncoderModel

    from pipeline.first_call import MethodModule

    sd, sd_call = stable_diffusion(1)
    fl, fl_call = flux(1)
    torch.manual_seed(0)
    dit = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=8,
        num_layers=1,
        sample_size=8,
        patch_size=2,
        norm_num_groups=8,
    ).eval()
    sd3 = SD3Transformer2DModel(
        sample_size=8,
        patch_size=1,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
    ).eval()
    clip = clip_text_encoder(layers=2)
    t5 = T5EncoderModel(T5Config(vocab_size=1000, d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4)).eval()
    ids = torch.randint(0, 1000, (1, 77))
    latents = torch.randn(2, 4, 8, 8)
    return {
        "unet": (sd.unet, ((latents, torch.tensor(10), torch.randn(2, 7, 16)), {})),
        "dit": (dit, ((latents,), {"timestep": torch.tensor([10, 10]), "class_labels": torch.tensor([1, 2])})),
        "sd3_transformer": (
            sd3,
            ((latents, torch.randn(2, 7, 32), torch.randn(2, 64), torch.tensor([10.0, 10.0])), {}),
        ),
        "flux_transformer": (fl.transformer, _flux_sample(fl_call)),
        "vae_encoder": (sd.vae.encoder, torch.randn(1, 3, 16, 16)),
        "vae_decoder": (MethodModule(sd.vae.decode), ((torch.randn(1, 4, 8, 8),), {"return_dict": False})),
        "clip_text_encoder": (clip, ((ids,), {})),
        "t5_encoder": (t5, ((ids,), {})),
    }


def _flux_sample(call: dict[str, Any]) -> Any:
    tokens, text = (call["height"] // 2) * (call["width"] // 2), call["prompt_embeds"].shape[1]
    return (
        (),
        {
            "hidden_states": torch.randn(1, tokens, 4),
            "encoder_hidden_states": call["prompt_embeds"],
            "pooled_projections": call["pooled_prompt_embeds"],
            "timestep": torch.tensor([0.5]),
            "img_ids": torch.zeros(tokens, 3),
            "txt_ids": torch.zeros(text, 3),
            "return_dict": False,
        },
    )
