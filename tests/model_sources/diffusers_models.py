"""diffusers: a UNet (2-D and text-conditioned), the DiT, SD3 and Flux transformers and two VAEs, from small
configs (random weights). Their output containers are issue 25's (diffusion) work: rows are marked as its."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from model_sources import ModelCase, image, seeded

OWNER = "issue 25 (diffusion): diffusers' output containers"


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded(seed))


def _unet2d() -> tuple[torch.nn.Module, Any]:
    from diffusers import UNet2DModel

    model = UNet2DModel(
        sample_size=16,
        block_out_channels=(16, 32),
        layers_per_block=1,
        norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=8,
    )
    return model, (image(16), torch.tensor([10]))


def _unet2d_condition() -> tuple[torch.nn.Module, Any]:
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(16, 32),
        layers_per_block=1,
        norm_num_groups=8,
        cross_attention_dim=32,
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )
    return model, (_randn(1, 4, 16, 16), torch.tensor([10]), _randn(1, 6, 32, seed=1))


def _dit() -> tuple[torch.nn.Module, Any]:
    from diffusers import DiTTransformer2DModel

    model = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        norm_num_groups=8,
        num_embeds_ada_norm=10,
    )
    return model, ((_randn(1, 4, 8, 8),), {"timestep": torch.tensor([10]), "class_labels": torch.tensor([3])})


def _sd3() -> tuple[torch.nn.Module, Any]:
    from diffusers import SD3Transformer2DModel

    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=32,
        pooled_projection_dim=16,
        pos_embed_max_size=16,
    )
    kwargs = {
        "encoder_hidden_states": _randn(1, 6, 32, seed=1),
        "pooled_projections": _randn(1, 16, seed=2),
        "timestep": torch.tensor([10]),
    }
    return model, ((_randn(1, 4, 8, 8),), kwargs)


def _flux() -> tuple[torch.nn.Module, Any]:
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=16,
        axes_dims_rope=(4, 6, 6),
    )
    tokens, text = 16, 6
    kwargs = {
        "encoder_hidden_states": _randn(1, text, 32, seed=1),
        "pooled_projections": _randn(1, 16, seed=2),
        "timestep": torch.tensor([0.5]),
        "img_ids": torch.zeros(tokens, 3),
        "txt_ids": torch.zeros(text, 3),
    }
    return model, ((_randn(1, tokens, 16),), kwargs)


def _vae() -> tuple[torch.nn.Module, Any]:
    from diffusers import AutoencoderKL

    model = AutoencoderKL(
        block_out_channels=(16, 32),
        norm_num_groups=8,
        latent_channels=4,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
    )
    return model, image(32)


def _tiny_vae() -> tuple[torch.nn.Module, Any]:
    from diffusers import AutoencoderTiny

    model = AutoencoderTiny(
        encoder_block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        num_encoder_blocks=(1, 1, 1, 1),
        num_decoder_blocks=(1, 1, 1, 1),
    )
    return model, image(32)


_BUILDERS: dict[str, tuple[str, Callable[[], tuple[torch.nn.Module, Any]]]] = {
    "UNet2DModel": ("unet", _unet2d),
    "UNet2DConditionModel": ("unet", _unet2d_condition),
    "DiTTransformer2DModel": ("transformer", _dit),
    "SD3Transformer2DModel": ("transformer", _sd3),
    "FluxTransformer2DModel": ("transformer", _flux),
    "AutoencoderKL": ("vae", _vae),
    "AutoencoderTiny": ("vae", _tiny_vae),
}


def _seeded_build(build: Callable[[], tuple[torch.nn.Module, Any]]) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    model, sample = build()
    return model.eval(), sample


def cases() -> list[ModelCase]:
    """One case per diffusers class of :data:`_BUILDERS`, owned by the diffusion work item."""
    return [
        ModelCase("diffusers", name, family, lambda b=build: _seeded_build(b), OWNER)
        for name, (family, build) in _BUILDERS.items()
    ]
