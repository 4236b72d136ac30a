"""The every-class diffusers source (``tests/model_sources/diffusers_all_models.py``): it enumerates what diffusers
exports, not a list, and its generic shrinker and sample search give small models that run."""

from __future__ import annotations

import inspect

import pytest
import torch
from model_sources import diffusers_all_models as every

FAMILIES = {"unet", "transformer", "video", "autoencoder", "controlnet", "audio", "other"}


@pytest.fixture(scope="module")
def cases() -> dict[str, every.ModelCase]:
    return {case.name: case for case in every.cases()}


def test_every_model_class_diffusers_exports_is_a_case_with_a_family(cases: dict[str, every.ModelCase]) -> None:
    diffusers = every._diffusers()
    exported = set()
    for name in dir(diffusers):
        try:
            value = getattr(diffusers, name)
        except Exception:  # noqa: BLE001, S112 - a lazy name whose module does not import is no model class
            continue
        if inspect.isclass(value) and issubclass(value, diffusers.ModelMixin) and value is not diffusers.ModelMixin:
            exported.add(name)
    assert len(exported) > 150  # diffusers 0.42.1 exports 161
    assert set(cases) == exported
    assert list(cases) == sorted(cases)
    assert {case.source for case in cases.values()} == {"diffusers_all"}
    assert {case.family for case in cases.values()} <= FAMILIES
    families = {name: case.family for name, case in cases.items()}
    assert families["UNet2DConditionModel"] == "unet" and families["AutoencoderKL"] == "autoencoder"
    assert families["FluxTransformer2DModel"] == "transformer" and families["WanTransformer3DModel"] == "video"
    assert families["FluxControlNetModel"] == "controlnet" and families["AutoencoderOobleck"] == "audio"


@pytest.mark.parametrize(
    ("name", "inputs"),
    [
        ("UNet2DConditionModel", {"sample", "timestep", "encoder_hidden_states"}),
        ("AutoencoderKL", {"sample"}),
        ("FluxTransformer2DModel", {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep",
                                    "img_ids", "txt_ids"}),
        ("SD3Transformer2DModel", {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"}),
    ],
)  # fmt: skip
def test_well_known_classes_build_small_and_run_on_the_sample_found_from_their_forward(
    cases: dict[str, every.ModelCase], name: str, inputs: set[str]
) -> None:
    model, (args, kwargs) = cases[name].build()
    assert args == () and set(kwargs) == inputs
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert not model.training
    with torch.no_grad():
        output = model(**kwargs)
    assert isinstance(output.to_tuple()[0], torch.Tensor)
    if name == "FluxTransformer2DModel":  # packed latents: one id row per token, its rotary axes split to the head
        assert kwargs["img_ids"].shape == (kwargs["hidden_states"].shape[1], 3)
        assert sum(model.config.axes_dims_rope) == model.config.attention_head_dim


def test_the_shrinker_reads_sizes_by_name_and_keeps_the_constraints_between_them() -> None:
    """Stage widths keep their count (down and up blocks still pair), widths are heads times head size, rotary axes
    scale with the head size, layer indices stay inside the layers, channels tying a model to its latents stay."""
    diffusers = every._diffusers()
    unet = every.shrunk_arguments(diffusers.UNet2DConditionModel)
    assert unet["block_out_channels"] == (32, 32, 32, 32) and unet["layers_per_block"] == 1
    assert unet["cross_attention_dim"] == every.WIDTH and unet["norm_num_groups"] == every.GROUPS
    assert unet["in_channels"] == 4
    flux = every.shrunk_arguments(diffusers.FluxTransformer2DModel)
    assert flux["num_attention_heads"] * flux["attention_head_dim"] == every.WIDTH
    assert sum(flux["axes_dims_rope"]) == flux["attention_head_dim"] and flux["in_channels"] == 64
    vace = every.shrunk_arguments(diffusers.WanVACETransformer3DModel)
    assert vace["num_layers"] == 1 and vace["vace_layers"] == [0]


def test_a_class_that_cannot_run_from_a_small_config_says_why_for_each_shrink(
    cases: dict[str, every.ModelCase],
) -> None:
    """RFD4-Proteina's autoencoder needs tensors of atom masks no default gives: PyTorch's outcome, with the reason."""
    with pytest.raises(RuntimeError) as raised:
        cases["RFD4ProteinaAutoencoder"].build()
    message = str(raised.value)
    assert message.startswith("RFD4ProteinaAutoencoder does not run eagerly from a small config: [small] TypeError")
    assert "atom37_mask" in message
    assert all(f"[{name}]" in message for name, _ in every.VARIANTS)
