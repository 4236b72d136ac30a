"""The decoding part of a generation conversion's accuracy report: per-step logits against PyTorch with its own cache.

A generation conversion (``convert(..., generation={...})``) is validated twice: the step graph against the same
step in PyTorch (:mod:`pipeline.validation.stage`), and whole decodings against transformers' own
``model.generate`` (its ``DynamicCache``), which is what this report holds: the logits of every step (the prefill,
then each decode step, the graph fed the tokens PyTorch chose) judged by the accuracy policy
(:func:`pipeline.accuracy.stats.judgement`, anchored to PyTorch's own error where the fixed tolerance fails), and the
number of greedy tokens the converted step chooses identically when it decodes on its own.
"""

from __future__ import annotations

import numpy as np

from converters.errors import AccuracyError
from pipeline.accuracy.stats import ErrorAccumulator
from pipeline.runtime.reports.accuracy import DecodingAccuracy, StepAccuracy
from pipeline.settings import Tolerance


class StepJudge:
    """Accumulates each step's logits (``add(step, actual, expected, tolerance)``) under the policy's tolerance; the
    tolerance given per call is the anchored one where the fixed tolerance failed on that prompt."""

    def __init__(self, tolerance: Tolerance) -> None:
        self.tolerance = tolerance
        self.steps: dict[int, ErrorAccumulator] = {}
        self.anchored: dict[int, int] = {}

    def add(self, step: int, actual: np.ndarray, expected: np.ndarray, tolerance: Tolerance | None = None) -> None:
        """One prompt's logits at ``step``."""
        accumulator = self.steps.setdefault(step, ErrorAccumulator(self.tolerance))
        accumulator.add(actual, expected, tolerance)
        if tolerance is not None:
            self.anchored[step] = self.anchored.get(step, 0) + 1

    def results(self) -> tuple[StepAccuracy, ...]:
        """Each step's figures, in order."""
        out = []
        for step in sorted(self.steps):
            stats = self.steps[step].result()
            out.append(
                StepAccuracy(
                    step,
                    stats.max_abs,
                    stats.max_rel,
                    stats.relative_rms,
                    stats.atol_used,
                    stats.outside,
                    stats.elements,
                    stats.passed,
                    self.anchored.get(step, 0),
                )  # fmt: skip
            )
        return tuple(out)


def raise_decoding_error(report: DecodingAccuracy) -> None:
    """The AccuracyError of a failed decoding validation: the failing steps' figures and the fix."""
    failing = [s for s in report.per_step if not s.passed]
    raise AccuracyError(
        f"decoding differs from PyTorch's own generate (DynamicCache) beyond tolerance at {len(failing)} of "
        f"{len(report.per_step)} steps on {len(report.prompts)} prompts ({', '.join(report.prompts)}): "
        + "; ".join(" ".join(s.line().split()) for s in failing[:4])
        + f"; {report.greedy_line()}",
        per_output={
            f"logits step {s.step}": {"max_abs": s.max_abs, "max_rel": s.max_rel, "relative_rms": s.relative_rms}
            for s in failing
        },
        fix="the step graph matches the step in PyTorch but not the model's own cached decoding: the cache writes, "
        "the mask or the positions differ from transformers'; please report it with the model (validate=False "
        "gives the module anyway)",
    )
