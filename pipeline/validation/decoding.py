"""The decoding part of a generation conversion's accuracy report: per-step logits against PyTorch with its own cache.

A generation conversion (``convert(..., generation={...})``) is validated twice: the step graph against the same
step in PyTorch (:mod:`pipeline.validation.stage`), and whole decodings against transformers' own
``model.generate`` (its ``DynamicCache``), which is what this report holds: the logits of every step (the prefill,
then each decode step, the graph fed the tokens PyTorch chose) judged by the accuracy policy
(:func:`pipeline.compare.stats.judgement`, anchored to PyTorch's own error where the fixed tolerance fails), and the
number of greedy tokens the converted step chooses identically when it decodes on its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from converters.errors import AccuracyError
from pipeline.compare.stats import ErrorAccumulator
from pipeline.settings import Tolerance

DECODING_RULE = (
    "per-step logits: the prefill and each decode step of the graph, fed the tokens PyTorch's greedy model.generate "
    "(its own DynamicCache) chose, against PyTorch's logits of the same step, judged by the accuracy policy of the "
    "type the graph computes in (anchored to PyTorch's own error in that type where the fixed tolerance fails)"
)


@dataclass(frozen=True)
class StepAccuracy:
    """One step's logits over every validation prompt: step 0 is the prefill, step k the k-th decode step."""

    step: int
    max_abs: float
    max_rel: float
    relative_rms: float
    atol_used: float
    outside: int
    elements: int
    passed: bool
    anchored: int = 0  # on how many prompts the fixed tolerance failed and the anchored one judged

    def line(self) -> str:
        """One row of the summary's table."""
        anchored = f"  (anchored on {self.anchored})" if self.anchored else ""
        return (
            f"          step {self.step:<3} max abs {self.max_abs:.2e} (atol {self.atol_used:.3g})  max rel "
            f"{self.max_rel:.2e}  RMS error {self.relative_rms:.2e} x RMS  {self.outside}/{self.elements} outside  "
            f"{'ok' if self.passed else 'FAIL'}{anchored}"
        )


@dataclass(frozen=True)
class DecodingAccuracy:
    """Per-step logits of whole decodings against PyTorch with its own cache, and greedy token identity.

    ``prompts`` describes each decoding compared (``"sample 1x6"``, ``"drawn 1x11"``, ``"left-padded 3x9"``);
    ``steps`` is the number of decode steps judged after the prefill; ``greedy`` counts the tokens the converted step
    chose (decoding on its own, greedy) equal to PyTorch float32 ``model.generate``'s, of ``greedy_tokens``, on the
    sample; ``first_divergence`` is the first new token where they differ (-1: none)."""

    prompts: tuple[str, ...]
    steps: int
    computed_in: str
    tolerance: dict[str, float]
    per_step: tuple[StepAccuracy, ...]
    greedy: int
    greedy_tokens: int
    first_divergence: int = -1
    precision: str = "fp32"
    note: str = ""
    rule: str = DECODING_RULE

    @property
    def passed(self) -> bool:
        """Every step's logits within the policy on every prompt."""
        return all(s.passed for s in self.per_step)

    @property
    def worst_step(self) -> StepAccuracy:
        """The step with the largest error relative to its tolerance (max abs over the atol used)."""
        return max(self.per_step, key=lambda s: (not s.passed, s.max_abs / max(s.atol_used, 1e-30)))

    def greedy_line(self) -> str:
        """``"fp16: 29/32 greedy tokens identical to PyTorch fp32 model.generate"``."""
        where = "" if self.first_divergence < 0 else f" (first divergence at new token {self.first_divergence})"
        return (
            f"{self.precision}: {self.greedy}/{self.greedy_tokens} greedy tokens identical to PyTorch fp32 "
            f"model.generate{where}"
        )

    def summary_lines(self) -> list[str]:
        """The summary's lines: the verdict, the prompts, the worst step, every step, the greedy count."""
        worst = self.worst_step
        lines = [
            f"decoding  {'PASS' if self.passed else 'FAIL'}: per-step logits against PyTorch generate (DynamicCache), "
            f"prefill + {self.steps} decode steps on {len(self.prompts)} prompts ({', '.join(self.prompts)}); judged "
            f"as {self.computed_in}; worst step {worst.step}: max abs {worst.max_abs:.2e}, max rel {worst.max_rel:.2e}",
            *(s.line() for s in self.per_step),
            f"          {self.greedy_line()}",
        ]
        if self.note:
            lines.append(f"          [{self.note}]")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (the report's ``accuracy.decoding``)."""
        data = asdict(self)
        data["worst_step"] = self.worst_step.step
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodingAccuracy:
        """The report from :meth:`to_dict` data."""
        fields = {k: v for k, v in data.items() if k not in ("per_step", "worst_step", "prompts")}
        return cls(
            prompts=tuple(data["prompts"]),
            per_step=tuple(StepAccuracy(**s) for s in data["per_step"]),
            **fields,
        )


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
                    step, stats.max_abs, stats.max_rel, stats.relative_rms, stats.atol_used, stats.outside,
                    stats.elements, stats.passed, self.anchored.get(step, 0),
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
