"""The per-step logits judge of the two-graph generation modules (pipeline.generation.generate_scores): a step
beyond the policy fails a float32 conversion, naming the step; a half-precision one is reported with its note and
does not fail (its logits are not anchored to PyTorch's own half-precision error)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from converters.errors import AccuracyError
from pipeline.generation.generate_scores import UNANCHORED_NOTE, judged_logits
from pipeline.runtime.io_spec import TensorSpec
from pipeline.settings import Settings


def _outputs(logits: list[torch.Tensor]) -> SimpleNamespace:
    return SimpleNamespace(sequences=torch.zeros(2, 5, dtype=torch.int64), logits=tuple(logits))


def _io(dtype: str) -> Any:
    """What the judge reads of the step's IOSpec: its logits output."""
    return SimpleNamespace(outputs=(TensorSpec("logits", dtype, (2, 64)),))


LOGITS = [torch.randn(2, 64, generator=torch.Generator().manual_seed(step)) for step in range(4)]


def test_equal_logits_pass_with_every_step_counted() -> None:
    report = judged_logits(_outputs(LOGITS), _outputs(LOGITS), _io("float32"), Settings(), "sample 2x5", 9)
    assert report.passed and [s.step for s in report.per_step] == [0, 1, 2, 3] and report.logits_judged == 8


def test_a_drifting_step_fails_a_float32_conversion_naming_it() -> None:
    drifted = [t.clone() for t in LOGITS]
    drifted[2][1, 7] += 0.05  # 0.05 against atol 1e-5 and rtol 1e-4: far beyond
    with pytest.raises(AccuracyError, match="at 1 of 4 steps"):
        judged_logits(_outputs(drifted), _outputs(LOGITS), _io("float32"), Settings(), "sample 2x5", 9)


def test_a_step_a_few_times_beyond_is_reported_with_its_note() -> None:
    drifted = [t.clone() for t in LOGITS]
    drifted[1][0, 3] += 4 * max(1e-5, 1e-4 * abs(float(LOGITS[1][0, 3])))  # 4x its tolerance: rounding compounded
    report = judged_logits(_outputs(drifted), _outputs(LOGITS), _io("float32"), Settings(), "sample 2x5", 9)
    assert not report.passed and "1 step(s) beyond the policy by at most 4.0x" in report.note


def test_a_half_precision_conversion_is_reported_not_failed() -> None:
    drifted = [t.clone() + 0.5 for t in LOGITS]
    report = judged_logits(
        _outputs(drifted), _outputs(LOGITS), _io("float16"), Settings(precision="fp16"), "sample 2x5", 9
    )
    assert not report.passed and report.note == UNANCHORED_NOTE and report.computed_in == "float16"


def test_the_half_anchor_generates_with_float32_pixels_before_a_convolution() -> None:
    """PyTorch's own float16 ``generate`` (the anchor of a half conversion's decoding check) gets the reference's
    float32 inputs in float16: ``conv2d`` compares its input's type with its weight's before any dispatch mode can
    cast it (DeepSeek-VL-Hybrid's high-resolution tower refused, and its check fell back to the fixed tolerance)."""
    import functools

    from pipeline.generation.generate_scores import _anchor_run

    tower = torch.nn.Conv2d(3, 4, 3).eval()

    def generate(pixel_values: torch.Tensor, steps: int) -> torch.Tensor:
        return tower(pixel_values).mean((2, 3)).repeat(1, steps)

    notes: set[str] = set()
    pixels = torch.randn(2, 3, 8, 8)
    out = _anchor_run(functools.partial(generate, pixel_values=pixels, steps=2), tower, "float16", notes)
    assert notes == set() and out is not None and out.dtype == torch.float16
    torch.testing.assert_close(out.float(), generate(pixels, 2), atol=1e-2, rtol=1e-2)
    assert tower.weight.dtype == torch.float32  # the weights put back


def test_an_anchor_run_that_cannot_follow_the_reference_tokens_says_so() -> None:
    """The anchor run is fed the reference's tokens; a ``generate`` that takes no logits processor runs as it is, and
    the report says that a step after its own tokens part keeps the fixed tolerance (it did so silently before)."""
    import functools

    from pipeline.generation.generate_scores import _anchor_run

    layer = torch.nn.Linear(4, 4).eval()

    def generate(inputs: torch.Tensor) -> torch.Tensor:  # no logits_processor: transformers' processor is refused
        return layer(inputs)

    notes: set[str] = set()
    sequences = torch.zeros(2, 5, dtype=torch.long)
    out = _anchor_run(functools.partial(generate, inputs=torch.randn(2, 4)), layer, "float32", notes, sequences)
    assert out is not None and out.dtype == torch.float64
    (note,) = notes
    assert "chose its own tokens" in note and "refused the token-forcing logits processor: TypeError" in note
    notes.clear()
    assert _anchor_run(functools.partial(generate, inputs=torch.randn(2, 4)), layer, "float32", notes) is not None
    assert notes == set()  # nothing to follow: nothing to say
