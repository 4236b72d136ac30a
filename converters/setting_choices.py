"""The values each setting may take (the ``Literal`` types of :class:`~converters.settings.Settings`' fields and
their tuples of choices), and the checks of a new ``Settings``' values: each plain setting's type, each choice among
its tuple, each number within its range. An error here is an :class:`InputError` naming the setting and the fix.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import MISSING, Field, fields
from typing import Any, Literal

from converters.block_settings import check_block_quantization
from converters.errors import InputError

Backend = Literal["auto", "onnxruntime", "tensorrt", "tensorrt-rtx"]
BACKENDS: tuple[str, ...] = ("auto", "onnxruntime", "tensorrt", "tensorrt-rtx")
CheckParser = Literal["auto", "tensorrt", "tensorrt-rtx", "static"]
CHECK_PARSERS: tuple[str, ...] = ("auto", "tensorrt", "tensorrt-rtx", "static")
HardwareCompatibility = Literal["none", "ampere_plus", "same_compute_capability"]
HARDWARE_COMPATIBILITY: tuple[str, ...] = ("none", "ampere_plus", "same_compute_capability")
Precision = Literal["fp32", "fp16", "bf16", "int8", "fp8", "int4", "nvfp4"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "fp8", "int4", "nvfp4")
QuantizeFallback = Literal["fp16", "fp32"]
QUANTIZE_FALLBACKS: tuple[str, ...] = ("fp16", "fp32")
OrtInt8ConvOutputs = Literal["requantize", "exact"]
ORT_INT8_CONV_OUTPUTS: tuple[str, ...] = ("requantize", "exact")
CalibrationMethod = Literal["auto", "max", "percentile", "entropy", "mse", "awq"]
CALIBRATION_METHODS: tuple[str, ...] = ("auto", "max", "percentile", "entropy", "mse", "awq")
Fallback = Literal["onnxruntime", "error"]
FALLBACKS: tuple[str, ...] = ("onnxruntime", "error")
PrecisionIO = Literal["model", "low"]
PRECISION_IO: tuple[str, ...] = ("model", "low")


def check_values(settings: Any) -> None:
    """Every value of ``settings`` (a new :class:`~converters.settings.Settings`) of its declared type, among its
    choices and within its range."""
    _check_types(settings)
    _check_choice(settings, "backend", BACKENDS)
    _check_choice(settings, "check_parser", CHECK_PARSERS)
    _check_choice(settings, "trt_hardware_compatibility", HARDWARE_COMPATIBILITY)
    if settings.validation_inputs < 0:
        raise InputError("validation_inputs must be >= 0", fix="pass validation_inputs=0 or more")
    if settings.weight_streaming_budget is not None and settings.weight_streaming_budget < -1:
        raise InputError(
            f"weight_streaming_budget must be -1 (automatic) or a number of bytes >= 0, got "
            f"{settings.weight_streaming_budget}",
            fix="pass weight_streaming_budget=-1, a byte count such as 2 << 30, or None to build without streaming",
        )
    if settings.ort_intra_op_threads is not None and settings.ort_intra_op_threads < 0:
        raise InputError(
            f"threads (ort_intra_op_threads) must be >= 0, got {settings.ort_intra_op_threads}",
            fix="pass the number of ONNX Runtime intra-op threads, 0 or None for ONNX Runtime's default",
        )
    if settings.trt_engine_cache_size is not None and settings.trt_engine_cache_size < 0:
        raise InputError(
            f"trt_engine_cache_size must be a number of bytes >= 0, got {settings.trt_engine_cache_size}",
            fix="pass e.g. trt_engine_cache_size=20 << 30 (20 GiB), or None (or 0) to keep every engine",
        )
    _check_precision(settings)
    _check_fallback(settings)


def _check_choice(settings: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(settings, name)
    if value not in choices:
        raise InputError(f"unknown {name} {value!r}", fix=f"use one of {', '.join(map(repr, choices))}")


def _check_fallback(settings: Any) -> None:
    _check_choice(settings, "fallback", FALLBACKS)
    if settings.min_segment_size < 1:
        raise InputError(
            f"min_segment_size must be >= 1, got {settings.min_segment_size}",
            fix="pass min_segment_size=1 or more (TensorRT runs of fewer compute nodes join ONNX Runtime)",
        )
    if settings.fallback_ops and settings.fallback == "error":
        raise InputError(
            f"fallback_ops={list(settings.fallback_ops)} moves ops to ONNX Runtime, but fallback='error' forbids it",
            fix="drop fallback_ops, or pass fallback='onnxruntime'",
        )


def _check_types(settings: Any) -> None:
    """Every plain setting has its declared type (``validation_inputs="3"`` is an error, not a crash later on)."""
    kind: type = type(settings)
    for f, allowed in _checked_fields(kind):
        value = getattr(settings, f.name)
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(settings, f.name, float(value))
            continue
        if not _is_instance(value, allowed):
            names = " or ".join(sorted({_type_name(t) for t in allowed}))
            raise InputError(
                f"setting {f.name} must be {names}, got {value!r} ({type(value).__name__})",
                fix=f"pass {f.name}= a value of type {names} (default: {_default_text(f)})",
            )


@functools.cache
def _checked_fields(cls: type) -> tuple[tuple[Field[Any], tuple[Any, ...]], ...]:
    """The fields :func:`_check_types` checks and the types each admits, read from the class's hints once (a settings
    object is made, and replaced, many times per conversion and at every load)."""
    hints = typing.get_type_hints(cls)
    skipped = ("dynamic", "tolerances", "keep_fp32", "profiles", "shape_tensor_values")  # normalised by readers
    checked = ((f, _allowed(hints[f.name])) for f in fields(cls) if f.name not in skipped)
    return tuple((f, allowed) for f, allowed in checked if allowed is not None)


def _allowed(hint: Any) -> tuple[Any, ...] | None:
    """The runtime types a type hint admits, or None for hints this check does not read (mappings)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_allowed(a) for a in typing.get_args(hint)]
        return None if any(p is None for p in parts) else tuple(t for p in parts if p for t in p)
    if origin is typing.Literal:  # the value's type here; membership is checked with the list of choices
        return tuple({type(a) for a in typing.get_args(hint)})
    if hint is type(None):
        return (type(None),)
    if origin is tuple:
        return (tuple,)
    if hint in (int, float, bool, str):
        return (hint,)
    return None


def _is_instance(value: Any, allowed: tuple[Any, ...]) -> bool:
    if isinstance(value, bool):
        return bool in allowed
    return isinstance(value, tuple(t for t in allowed if isinstance(t, type)))


def _type_name(t: Any) -> str:
    return "None" if t is type(None) else (t.__name__ if isinstance(t, type) else repr(t))


def _default_text(f: Any) -> str:
    return repr(f.default) if f.default is not MISSING else "computed"


def _check_precision(settings: Any) -> None:
    _check_choice(settings, "precision", PRECISIONS)
    keep = settings.keep_fp32
    object.__setattr__(settings, "keep_fp32", (keep,) if isinstance(keep, str) else tuple(str(k) for k in keep))
    if settings.calibration_inputs < 0:
        raise InputError("calibration_inputs must be >= 0", fix="pass calibration_inputs=0 or more")
    if settings.precision_range_margin < 1:
        raise InputError("precision_range_margin must be >= 1", fix="pass e.g. precision_range_margin=4.0")
    if not 0 <= settings.precision_min_share <= 1:
        raise InputError("precision_min_share must be within [0, 1]", fix="pass e.g. precision_min_share=0.5")
    _check_quantization(settings)
    _check_precision_io(settings)


def _check_quantization(settings: Any) -> None:
    _check_choice(settings, "quantize_fallback", QUANTIZE_FALLBACKS)
    _check_choice(settings, "calibration_method", CALIBRATION_METHODS)
    _check_choice(settings, "ort_int8_conv_outputs", ORT_INT8_CONV_OUTPUTS)
    if not 0 < settings.calibration_percentile <= 100:
        raise InputError("calibration_percentile must be within (0, 100]", fix="pass e.g. calibration_percentile=99.99")
    check_block_quantization(settings)
    if settings.precision in ("int8", "fp8", "int4", "nvfp4") and settings.precision_io == "low":
        raise InputError(
            f"precision_io='low' is not supported with precision={settings.precision!r}: graph inputs stay float32",
            fix="leave precision_io='model' with int8/fp8/int4/nvfp4",
        )


def _check_precision_io(settings: Any) -> None:
    _check_choice(settings, "precision_io", PRECISION_IO)
    if settings.precision_io == "model" or settings.precision == "fp16":
        return
    if settings.precision == "fp32":
        raise InputError(
            "precision_io='low' needs a low precision, but precision is 'fp32'",
            fix="pass precision='fp16' with precision_io='low', or leave precision_io='model'",
        )
    # bf16: the graph would take and return bfloat16 tensors, which cannot be fed or checked here
    raise InputError(
        "precision_io='low' is not supported with precision='bf16': numpy has no bfloat16 type, so ONNX Runtime "
        "cannot be fed bfloat16 inputs or return bfloat16 outputs, and a bfloat16 graph could not be run or "
        "validated against PyTorch",
        fix="use precision_io='model' with bf16 (float32 inputs and outputs, casts at the boundary), or "
        "precision='fp16' with precision_io='low'",
    )
