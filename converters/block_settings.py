"""The checks of the 4-bit settings (``precision="int4"``/``"nvfp4"``, ``block_size``, ``nvfp4_activations``,
``quantize_embeddings``, ``ort_int4_accuracy_level``): part of :class:`converters.settings.Settings`' validation, in
a module of its own so that the settings object stays readable."""

from __future__ import annotations

from typing import Any

import onnx

from converters.errors import InputError

#: The precisions that store weights in 4 bits.
FOUR_BIT_PRECISIONS = ("int4", "nvfp4")
#: NVFP4's block: 16 FP4 values per FP8 scale, fixed by the format (``passes.quantize.blockwise.NVFP4_BLOCK``).
NVFP4_BLOCK = 16
#: INT4's block when ``block_size`` is not given (TensorRT takes 32 to 128).
DEFAULT_INT4_BLOCK = 128


def check_block_quantization(settings: Any) -> None:
    """Raise an InputError naming the setting and the fix for a bad 4-bit combination (``settings``: a Settings)."""
    four_bit = settings.precision in FOUR_BIT_PRECISIONS
    if settings.calibration_method == "awq" and not four_bit:
        raise InputError(
            f"calibration_method='awq' chooses 4-bit weight scales, but precision is {settings.precision!r}",
            fix="pass precision='int4' or 'nvfp4' with calibration_method='awq'",
        )
    if four_bit and settings.calibration_method not in ("auto", "max", "awq"):
        raise InputError(
            f"calibration_method={settings.calibration_method!r} calibrates activations; precision="
            f"{settings.precision!r} quantizes weights only",
            fix="use calibration_method='max' (the default) or 'awq' (activation-aware scales)",
        )
    if settings.precision == "nvfp4" and not hasattr(onnx.TensorProto, "FLOAT4E2M1"):
        raise InputError(
            f"precision='nvfp4' stores FLOAT4E2M1 weights, which onnx {onnx.__version__} does not have",
            fix="pip install 'onnx>=1.18' (or use precision='int4')",
        )
    _normalise_block_size(settings)
    if settings.block_size < 16 or settings.block_size & (settings.block_size - 1):
        raise InputError(
            f"block_size must be a power of two >= 16, got {settings.block_size}",
            fix="pass block_size=32, 64 or 128 (TensorRT's INT4 range; 128 is the default)",
        )
    if settings.ort_int4_accuracy_level not in (0, 1, 2, 3, 4):
        raise InputError(
            f"ort_int4_accuracy_level must be 0 to 4, got {settings.ort_int4_accuracy_level}",
            fix="pass 1 (float32 activations: exact) or 4 (int8 activations: faster)",
        )
    if settings.nvfp4_activations and settings.precision != "nvfp4":
        raise InputError(
            f"nvfp4_activations=True quantizes activations to NVFP4 next to NVFP4 weights, but precision is "
            f"{settings.precision!r}",
            fix="pass precision='nvfp4' with nvfp4_activations=True (W4A4), or drop nvfp4_activations",
        )
    if settings.quantize_embeddings and not four_bit:
        raise InputError(
            f"quantize_embeddings=True stores embedding tables in 4 bits, but precision is {settings.precision!r}",
            fix="pass precision='int4' or 'nvfp4' with quantize_embeddings=True",
        )


def _normalise_block_size(settings: Any) -> None:
    """``block_size`` as used: NVFP4's fixed 16 (another value given is an error, never ignored while the settings
    claim it), else the value given or :data:`DEFAULT_INT4_BLOCK`."""
    if settings.precision == "nvfp4":
        if settings.block_size not in (None, NVFP4_BLOCK):
            raise InputError(
                f"precision='nvfp4' quantizes weights in blocks of {NVFP4_BLOCK} values, fixed by the format (one FP8 "
                f"scale per {NVFP4_BLOCK} FP4 values), but block_size={settings.block_size} was given",
                fix="drop block_size with precision='nvfp4' (or pass 16); block_size chooses the blocks of "
                "precision='int4' (32 to 128 for TensorRT)",
            )
        object.__setattr__(settings, "block_size", NVFP4_BLOCK)
    elif settings.block_size is None:
        object.__setattr__(settings, "block_size", DEFAULT_INT4_BLOCK)
