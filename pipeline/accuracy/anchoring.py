"""Applying the anchored rule (:mod:`pipeline.accuracy.anchor`) input by input: which outputs the fixed tolerance
fails, PyTorch's own run for those (once per input and type), their tolerance on that input, and what the report
says about it."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from pipeline.accuracy.anchor import FACTORS, AnchorRuns, anchor_type, anchored_tolerance
from pipeline.accuracy.stats import Judgement, tolerance_ratio
from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import Tolerance

logger = logging.getLogger(__name__)


class Anchoring:
    """Per input, the anchored tolerance of each output the fixed one fails (``tolerances``); afterwards, one note
    per anchored output (``note``). ``judged`` holds every output's judgement; those with an ``anchor`` type take
    part.

    >>> # for feed, actual, expected in ...: accumulators[name].add(a, e, anchoring.tolerances(feed, a, e).get(name))
    """

    def __init__(
        self, model: torch.nn.Module, io: IOSpec, judged: Mapping[str, Judgement], runs: AnchorRuns | None = None
    ) -> None:
        self.judged = {name: j for name, j in judged.items() if j.anchor}
        self.runs = runs or AnchorRuns(model, io)  # shared by the Anchorings of several backends on one model
        self.lines: dict[str, list[str]] = {}
        self.unanchored: dict[str, list[str]] = {}  # inputs where PyTorch's own run gave nothing to anchor to
        self.inputs = 0

    def tolerances(
        self, feed: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]
    ) -> dict[str, Tolerance]:
        """The anchored tolerance on this input of each output the fixed tolerance fails on it (others: absent)."""
        self.inputs += 1
        anchors: dict[str, dict[str, np.ndarray] | None] = {}
        out = {}
        for name, judged in self.judged.items():
            got, want = np.asarray(actual[name]), np.asarray(expected[name])
            if got.shape != want.shape or tolerance_ratio(got, want, judged.tolerance) <= 1:
                continue
            if judged.anchor not in anchors:
                anchors[judged.anchor] = self.runs.outputs(judged.anchor, feed)
            anchor = anchors[judged.anchor]
            if anchor is None or name not in anchor:
                continue
            out[name], line = anchored_tolerance(judged.tolerance, want, anchor[name], judged.anchor, got)
            if line:
                kept = self.unanchored if out[name] is judged.tolerance else self.lines
                kept.setdefault(name, []).append(f"input {self.inputs - 1}: {line}")
        return out

    def note(self, name: str) -> str:
        """What the report says beside output ``name`` about the anchored rule (``""``: it was not needed)."""
        judged = self.judged.get(name)
        if judged is None:
            return ""
        refused = self.runs.note(judged.anchor)
        lines, unanchored = self.lines.get(name, []), "; ".join(self.unanchored.get(name, []))
        if not lines:
            return "; ".join(filter(None, [unanchored, refused if judged.anchor in self.runs.refused else ""]))
        factor = FACTORS[judged.anchor]
        text = (
            f"the fixed tolerance failed on {len(lines)} of {self.inputs} input(s), judged there within {factor:g}x "
            f"PyTorch's own error ({'; '.join(lines)})"
        )
        return "; ".join(filter(None, [text, unanchored, refused]))

    def log_cost(self) -> None:
        """One INFO line: how many extra PyTorch runs the anchored rule took, and how long."""
        if self.runs.runs or self.runs.refused:
            refused = "; ".join(f"{k}: {v}" for k, v in self.runs.refused.items())
            logger.info(
                "accuracy: %d PyTorch run(s) in the anchor type for outputs the fixed tolerance failed (%.2fs)%s",
                self.runs.runs,
                self.runs.seconds,
                f"; refused: {refused}" if refused else "",
            )


def anchored_per_input(
    model: torch.nn.Module,
    io: IOSpec,
    feeds: Sequence[Mapping[str, np.ndarray]],
    references: Sequence[Mapping[str, np.ndarray]],
    tolerances: Mapping[str, Tolerance],
    computed_in: str,
) -> tuple[list[dict[str, Tolerance]], str]:
    """Each feed's tolerances with those of anchored outputs (a default ``computed_in`` tolerance) widened to
    PyTorch's own error on it: what the precision stage scores candidates by once the fixed tolerance fails on its
    calibration inputs (one PyTorch run per feed). The note says what was done, or why not."""
    runs = AnchorRuns(model, io)
    names = [name for name, tolerance in tolerances.items() if anchor_type(computed_in, tolerance, False)]
    per_input: list[dict[str, Tolerance]] = []
    unanchored: list[str] = []
    for i, (feed, reference) in enumerate(zip(feeds, references, strict=True)):
        anchor = runs.outputs(computed_in, feed) if names else None
        widened = dict(tolerances)
        for name in names:
            if anchor is not None:
                widened[name], line = anchored_tolerance(tolerances[name], reference[name], anchor[name], computed_in)
                if widened[name] is tolerances[name] and line:
                    unanchored.append(f"{name} on input {i}: {line}")
        per_input.append(widened)
    note = runs.note(computed_in) if names else ""
    if names and computed_in not in runs.refused:
        note = "; ".join(filter(None, [f"judged within {FACTORS[computed_in]:g}x PyTorch's own {computed_in} "
                                       f"error on each calibration input ({runs.seconds:.2f}s)", *unanchored[:2],
                                       note]))  # fmt: skip
    return per_input, note
