"""The records the passes hand to the conversion report: plain frozen dataclasses with no graph code, so that the
runtime can read a saved report (``pipeline.runtime.reports``) without importing the passes themselves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PassRecord:
    """One pass run, as it appears in the conversion report."""

    name: str
    iteration: int
    seconds: float
    nodes_before: int
    nodes_after: int
    modified: bool


@dataclass(frozen=True)
class Island:
    """One node kept in float32, where it comes from (rule, user, measured, search) and why."""

    node: str
    op: str
    source: str
    reason: str
    module: str | None = None


@dataclass(frozen=True)
class QuantizedOp:
    """One quantized weighted op: its activation's calibrated range and scale, and its weight's scales."""

    node: str
    op: str
    activation: str  # the activation tensor as named in the quantized graph
    activation_amax: float
    activation_scale: float
    weight: str | None
    weight_channels: int  # scales of the weight (1: per tensor)
    weight_scale_min: float
    weight_scale_max: float
    weight_elements: int


@dataclass(frozen=True)
class Skipped:
    """A weighted op left in the float type, and why."""

    node: str
    op: str
    reason: str
