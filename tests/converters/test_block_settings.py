"""The checks of the 4-bit settings (``converters.block_settings``): every refusal with its message and fix, every
accepted edge, and the block size each precision ends up with. Settings only: nothing is quantized here (the 4-bit
conversions are tests/pipeline/test_quantize_4bit.py)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import onnx
import pytest

from converters import block_settings
from converters.block_settings import (
    DEFAULT_INT4_BLOCK,
    FOUR_BIT_PRECISIONS,
    NVFP4_BLOCK,
    check_block_quantization,
)
from converters.errors import InputError
from converters.settings import Settings


@dataclass
class Given:
    """The settings fields the check reads (a stand-in for Settings, whose other checks could answer first)."""

    precision: str = "fp32"
    calibration_method: str = "auto"
    block_size: int | None = None
    ort_int4_accuracy_level: int = 1
    nvfp4_activations: bool = False
    quantize_embeddings: bool = False


def refused(message: str, fix: str, **given: Any) -> None:
    """The check refuses ``given`` with exactly ``message`` and ``fix`` (the words are the interface: they say what to
    change)."""
    with pytest.raises(InputError) as error:
        check_block_quantization(Given(**given))
    assert str(error.value) == f"[input] {message}\n  fix: {fix}"


def checked(**given: Any) -> Given:
    settings = Given(**given)
    check_block_quantization(settings)
    return settings


def test_the_constants() -> None:
    assert FOUR_BIT_PRECISIONS == ("int4", "nvfp4") and NVFP4_BLOCK == 16 and DEFAULT_INT4_BLOCK == 128


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "int8", "fp8"])
def test_awq_needs_a_four_bit_precision(precision: str) -> None:
    refused(
        f"calibration_method='awq' chooses 4-bit weight scales, but precision is {precision!r}",
        "pass precision='int4' or 'nvfp4' with calibration_method='awq'",
        precision=precision,
        calibration_method="awq",
    )


@pytest.mark.parametrize("precision", ["int4", "nvfp4"])
@pytest.mark.parametrize("method", ["auto", "max", "awq"])
def test_the_weight_calibrations_of_four_bits(precision: str, method: str) -> None:
    settings = checked(precision=precision, calibration_method=method)
    assert settings.calibration_method == method


@pytest.mark.parametrize("precision", ["int4", "nvfp4"])
@pytest.mark.parametrize("method", ["mse", "percentile", "entropy"])
def test_activation_calibrations_are_refused_with_four_bits(precision: str, method: str) -> None:
    refused(
        f"calibration_method={method!r} calibrates activations; precision={precision!r} quantizes weights only",
        "use calibration_method='max' (the default) or 'awq' (activation-aware scales)",
        precision=precision,
        calibration_method=method,
    )


def test_activation_calibrations_are_fine_for_eight_bits() -> None:
    checked(precision="int8", calibration_method="entropy")
    checked(precision="fp8", calibration_method="mse")


def test_nvfp4_needs_an_onnx_with_float4(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx 1.17 (the floor of the dependencies) has no FLOAT4E2M1: an onnx of its kind stands in."""
    assert hasattr(onnx.TensorProto, "FLOAT4E2M1")
    monkeypatch.setattr(block_settings, "onnx", SimpleNamespace(TensorProto=SimpleNamespace(), __version__="1.17.0"))
    refused(
        "precision='nvfp4' stores FLOAT4E2M1 weights, which onnx 1.17.0 does not have",
        "pip install 'onnx>=1.18' (or use precision='int4')",
        precision="nvfp4",
    )
    assert checked(precision="int4").block_size == 128  # int4 needs no FLOAT4E2M1


def test_the_block_size_each_precision_ends_up_with() -> None:
    assert checked(precision="nvfp4").block_size == 16
    assert checked(precision="nvfp4", block_size=16).block_size == 16
    assert checked(precision="int4").block_size == 128
    assert checked(precision="int4", block_size=32).block_size == 32
    assert checked(precision="fp32").block_size == 128  # unused, but never None once checked
    assert checked(precision="fp32", block_size=64).block_size == 64
    assert Settings(precision="nvfp4").block_size == 16 and Settings().block_size == 128


@pytest.mark.parametrize("block_size", [8, 32, 64, 128, None])
def test_nvfp4_refuses_any_block_but_its_own(block_size: int | None) -> None:
    if block_size is None:
        assert checked(precision="nvfp4").block_size == 16
        return
    refused(
        "precision='nvfp4' quantizes weights in blocks of 16 values, fixed by the format (one FP8 scale per 16 FP4 "
        f"values), but block_size={block_size} was given",
        "drop block_size with precision='nvfp4' (or pass 16); block_size chooses the blocks of precision='int4' "
        "(32 to 128 for TensorRT)",
        precision="nvfp4",
        block_size=block_size,
    )


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
def test_int4_takes_powers_of_two_from_16(block_size: int) -> None:
    assert checked(precision="int4", block_size=block_size).block_size == block_size


@pytest.mark.parametrize("block_size", [8, 4, 1, 0, -16, 24, 48, 96, 129])
def test_int4_refuses_other_block_sizes(block_size: int) -> None:
    refused(
        f"block_size must be a power of two >= 16, got {block_size}",
        "pass block_size=32, 64 or 128 (TensorRT's INT4 range; 128 is the default)",
        precision="int4",
        block_size=block_size,
    )


@pytest.mark.parametrize("level", [0, 1, 2, 3, 4])
def test_the_onnxruntime_int4_accuracy_levels(level: int) -> None:
    assert checked(precision="int4", ort_int4_accuracy_level=level).ort_int4_accuracy_level == level


@pytest.mark.parametrize("level", [-1, 5, 1.5])
def test_other_accuracy_levels_are_refused(level: float) -> None:
    refused(
        f"ort_int4_accuracy_level must be 0 to 4, got {level}",
        "pass 1 (float32 activations: exact) or 4 (int8 activations: faster)",
        ort_int4_accuracy_level=level,
    )


def test_nvfp4_activations_need_nvfp4_weights() -> None:
    assert checked(precision="nvfp4", nvfp4_activations=True).nvfp4_activations
    for precision in ("int4", "fp32", "int8"):
        refused(
            "nvfp4_activations=True quantizes activations to NVFP4 next to NVFP4 weights, but precision is "
            f"{precision!r}",
            "pass precision='nvfp4' with nvfp4_activations=True (W4A4), or drop nvfp4_activations",
            precision=precision,
            nvfp4_activations=True,
        )


def test_quantized_embeddings_need_four_bit_weights() -> None:
    assert checked(precision="int4", quantize_embeddings=True).quantize_embeddings
    assert checked(precision="nvfp4", quantize_embeddings=True).quantize_embeddings
    for precision in ("fp32", "int8", "fp16"):
        refused(
            f"quantize_embeddings=True stores embedding tables in 4 bits, but precision is {precision!r}",
            "pass precision='int4' or 'nvfp4' with quantize_embeddings=True",
            precision=precision,
            quantize_embeddings=True,
        )


def test_settings_run_the_check() -> None:
    with pytest.raises(InputError, match="block_size must be a power of two"):
        Settings(precision="int4", block_size=24)
