"""The quantize stage runs PyTorch and ONNX Runtime no more than it needs to: the 4-bit formats' envelope reuses the
errors measured on the calibration inputs, and validation inputs the calibration already ran are not run again (the
8 s a default int4 Llama conversion spent on them). Real small language model, real export, real sessions."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from charlm_support import CharLM

import pipeline
from pipeline.quantize.search import _errors

SAMPLE = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))


def _fingerprint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """The call's inputs as one key; none while the exporter traces (its tensors hold no values)."""
    tensors = [*args, *kwargs.values()]
    if any(type(t) is not torch.Tensor for t in tensors):
        return []
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return [digest.hexdigest()]


def test_a_validated_int4_conversion_runs_pytorch_on_each_input_at_most_twice() -> None:
    torch.manual_seed(0)
    model = CharLM(40, width=64, layers=1).eval()
    calls: Counter[str] = Counter()
    model.register_forward_pre_hook(lambda _, args, kwargs: calls.update(_fingerprint(args, kwargs)), with_kwargs=True)
    converted = pipeline.convert(model, SAMPLE, precision="int4", validation_inputs=3, calibration_inputs=3)
    assert converted.report.quantization is not None
    sample = _fingerprint((SAMPLE,), {})[0]
    drawn = [count for key, count in calls.items() if key != sample]
    # each drawn input once for the calibration (which holds validation's inputs when the conversion validates) and
    # once in validation; the envelope of the quantized outputs ran validation's a third time before (and the sample
    # a fourth: the export runs it too)
    assert len(drawn) >= 6 and max(drawn) <= 2 and calls[sample] <= 3, (calls[sample], sorted(drawn))
    assert converted.report.accuracy is not None and converted.report.accuracy.passed


def test_errors_in_float32_are_float64s_and_skip_what_is_not_finite() -> None:
    rng = np.random.default_rng(0)
    want = rng.standard_normal((64, 512)).astype(np.float32) * 3
    got = (want + rng.standard_normal(want.shape).astype(np.float32) * 1e-2).astype(np.float32)
    relative, largest = _errors(got, want)  # type: ignore[misc]
    wide = got.astype(np.float64) - want.astype(np.float64)
    assert abs(relative - np.linalg.norm(wide) / np.linalg.norm(want.astype(np.float64))) < 1e-6 * relative
    assert largest == np.abs(wide).max()
    got[0, 0], got[1, 1] = np.inf, np.nan
    relative, largest = _errors(got, want)  # type: ignore[misc]
    assert not np.isfinite(relative)  # the caller's max() keeps the worst finite error
    assert largest == np.abs(np.delete(wide.reshape(-1), [0, 513])).max()
    huge = np.full(4, 3e38, np.float32)
    with np.errstate(over="ignore"):
        assert _errors(huge, -huge) == pytest.approx((2.0, 6e38))  # float32 overflows: measured again in float64
    assert _errors(np.arange(3), np.arange(3)) is None
