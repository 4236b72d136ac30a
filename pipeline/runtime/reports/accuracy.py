"""The validation stage's records (``module.report.accuracy``): each output's worst error and verdict, the drawn
inputs PyTorch refused, and a generation step's whole decodings against PyTorch's own ``generate``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DroppedInput:
    """A drawn validation input PyTorch itself refused, left out of the comparison: its index among the
    validation inputs (0 is the sample), the torch function that raised (its innermost public Python function, else
    the ATen op, ``"aten.op.overload"``; ``""`` when not known) and why."""

    index: int
    function: str
    reason: str

    def summary(self) -> str:
        """One line: which input, where PyTorch raised, and what it said."""
        kind = "ATen op" if self.function.startswith(("aten.", "prims.")) else "torch function"
        where = f" in {kind} {self.function!r}" if self.function else ""
        return f"input {self.index} dropped: PyTorch raised{where}: {self.reason}"


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

    ``prompts`` describes each decoding run compared (``"sample 1x6"``, ``"drawn 1x11"``, ``"left-padded 3x9
    (drawn, 9/4/2 tokens)"``: one batch of drawn prompts); ``steps`` is the number of decode steps judged after the
    prefill; ``rows`` the prompts decoded (the rows of every run), ``prompt_tokens`` their tokens (padding not
    counted) and ``logits_judged`` the logit vectors judged (``rows * (steps + 1)``); ``greedy`` counts the tokens
    the converted step chose (decoding on its own, greedy) equal to PyTorch float32 ``model.generate``'s, of
    ``greedy_tokens``, on the sample; ``first_divergence`` is the first new token where they differ (-1: none);
    ``greedy_reused`` says that run was also the sample's judged one (its tokens were PyTorch's through the judged
    steps, so its logits are the teacher-forced ones). Reports saved before ``rows`` existed hold 0 there."""

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
    rows: int = 0
    prompt_tokens: int = 0
    logits_judged: int = 0
    greedy_reused: bool = False

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
        reused = " (the same run gave the sample's judged logits)" if self.greedy_reused else ""
        return (
            f"{self.precision}: {self.greedy}/{self.greedy_tokens} greedy tokens identical to PyTorch fp32 "
            f"model.generate{where}{reused}"
        )

    def runs_text(self) -> str:
        """``"4 prompts in 2 runs (sample 1x6, left-padded 3x9 (drawn, 9/4/2 tokens)): 21 prompt tokens, 36 logit
        vectors judged"`` (a report saved before ``rows`` existed: ``"3 prompts (...)"``)."""
        if not self.rows:
            return f"{len(self.prompts)} prompts ({', '.join(self.prompts)})"
        return (
            f"{self.rows} prompts in {len(self.prompts)} runs ({', '.join(self.prompts)}): {self.prompt_tokens} prompt "
            f"tokens, {self.logits_judged} logit vectors judged"
        )

    def summary_lines(self) -> list[str]:
        """The summary's lines: the verdict, the prompts, the worst step, every step, the greedy count."""
        worst = self.worst_step
        lines = [
            f"decoding  {'PASS' if self.passed else 'FAIL'}: per-step logits against PyTorch generate (DynamicCache), "
            f"prefill + {self.steps} decode steps on {self.runs_text()}; judged as {self.computed_in}; worst step "
            f"{worst.step}: max abs {worst.max_abs:.2e}, max rel {worst.max_rel:.2e}",
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


@dataclass(frozen=True)
class OutputAccuracy:
    """The worst error of one output over all validation inputs, and the rule it was judged by.

    ``computed_in`` is the type the graph computes the output in, whose tolerance judged it; ``outside`` counts
    the elements outside the rule (NaN on one side only among them); ``note`` says why the rule or tolerance is
    not the plain one (a random output judged by distribution, a float64 output judged as float32, ...)."""

    name: str
    dtype: str
    max_abs: float
    max_rel: float
    mean_abs: float
    atol: float
    rtol: float
    passed: bool
    computed_in: str = ""
    elements: int = 0
    outside: int = 0
    note: str = ""
    #: the magnitude-relative rule of low precision (0: none): atol grows to rms_atol * RMS(torch) (the largest
    #: atol so used is atol_used), and RMS(error) / RMS(torch) (worst: relative_rms) must stay <= rms
    rms_atol: float = 0.0
    rms: float = 0.0
    atol_used: float = 0.0
    relative_rms: float = 0.0
    rms_failed: int = 0

    def summary(self) -> str:
        """One line: the figures and the verdict, consistent with each other."""
        if self.note.startswith(("random", "uninitialised")):
            return f"{self.name}: {'ok' if self.passed else 'FAIL'}, {self.note}"
        atol = f"atol {self.atol:g}"
        if self.atol_used > self.atol and not self.rms_atol:  # widened by the anchored rule on some input
            atol += f", anchored up to {self.atol_used:.3g}"
        if self.rms_atol:
            atol = f"atol max({self.atol:g}, {self.rms_atol:g} x RMS) = {self.atol_used:.3g}"
        text = (
            f"{self.name}: max abs {self.max_abs:.3g} ({atol}), max rel {self.max_rel:.3g} (rtol "
            f"{self.rtol:g}): {self.outside} of {self.elements} elements outside"
        )
        if self.rms:
            text += (
                f"; RMS error {self.relative_rms:.3g} x RMS (rms {self.rms:g}): beyond on {self.rms_failed} input(s)"
            )
        return text + (f" [{self.note}]" if self.note else "")


@dataclass(frozen=True)
class AccuracyReport:
    """The validation stage's result: how many inputs were compared, each output's figures, and the rule;
    ``dropped`` lists the drawn inputs PyTorch refused, which were not compared (``inputs`` does not count them)."""

    inputs: int
    outputs: tuple[OutputAccuracy, ...]
    rule: str
    dropped: tuple[DroppedInput, ...] = ()
    #: a generation conversion's whole decodings against the model's own cached generate (per-step logits)
    decoding: DecodingAccuracy | None = None

    @property
    def passed(self) -> bool:
        """Every output within its tolerance on every input (and every decoding step, for a generation step)."""
        return all(o.passed for o in self.outputs) and (self.decoding is None or self.decoding.passed)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``report.json``, the artifact's metadata)."""
        return {
            "inputs": self.inputs,
            "rule": self.rule,
            "outputs": [asdict(o) for o in self.outputs],
            "dropped": [asdict(d) for d in self.dropped],
            "decoding": None if self.decoding is None else self.decoding.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AccuracyReport:
        """A report from :meth:`to_dict` data (data saved before ``dropped`` existed has none)."""
        return cls(
            inputs=int(data["inputs"]),
            outputs=tuple(OutputAccuracy(**o) for o in data["outputs"]),
            rule=data["rule"],
            dropped=tuple(DroppedInput(**d) for d in data.get("dropped", ())),
            decoding=DecodingAccuracy.from_dict(data["decoding"]) if data.get("decoding") else None,
        )

    def dropped_lines(self) -> list[str]:
        """The summary's lines about dropped inputs: none when every drawn input was compared."""
        if not self.dropped:
            return []
        head = (
            f"          {len(self.dropped)} drawn input(s) dropped: PyTorch itself refused them "
            "(report.accuracy.dropped)"
        )
        return [head, *(f"          {d.summary()}" for d in self.dropped)]
