"""What the precision stage reports (``module.report.precision``): islands with reasons, casts, the share of compute
in the low type, the calibration error and the search; and the judgement that little compute in the low type is a
loud warning, or an error under ``precision_strict``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.errors import ConversionError
from passes.precision.convert import Island
from pipeline.precision.share import ComputeShare
from pipeline.settings import Settings, Tolerance

logger = logging.getLogger(__name__)

#: When the search runs, it aims at this fraction of the tolerance, leaving headroom for unseen inputs.
SEARCH_TARGET = 0.5


@dataclass(frozen=True)
class SearchSummary:
    """What the accuracy-driven search did: candidates tried, builds, nodes kept in float32, and the error it
    reached."""
    candidates: int
    builds: int
    kept: int  # nodes the search keeps in float32, after pruning
    pruned: int  # nodes of the bisected head that pruning put back in the low type
    error_before: float  # worst error / tolerance on the calibration inputs, before and after
    error_after: float
    target: float = SEARCH_TARGET


@dataclass(frozen=True)
class PrecisionReport:
    """What the precision stage did; ``module.report.precision``."""

    precision: str
    dtype: str
    islands: tuple[Island, ...]
    unmatched_keep_fp32: tuple[str, ...]
    casts_before: int
    casts_after: int
    low_flops: float
    total_flops: float
    low_nodes: int
    float_nodes: int
    share: float
    basis: str
    calibration_inputs: int
    calibration_error: float  # worst |error| / tolerance against PyTorch fp32 on the calibration inputs
    tolerance: Tolerance
    search: SearchSummary | None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def casts_added(self) -> int:
        """Casts the precision rewrite added to the graph."""
        return self.casts_after - self.casts_before

    def keep_fp32(self) -> tuple[str, ...]:
        """The user, measured and searched islands as ``keep_fp32`` entries, to reuse without measuring again."""
        return tuple(f"node:{i.node}" for i in self.islands if i.source != "rule")

    def save_keep_fp32(self, path: str | Path) -> Path:
        """Write :meth:`keep_fp32` as a JSON list; read it back with :func:`load_keep_fp32`."""
        target = Path(path)
        target.write_text(json.dumps(list(self.keep_fp32()), indent=1))
        return target

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrecisionReport:
        """A report from :meth:`to_dict` data."""
        values = dict(data)
        values["islands"] = tuple(Island(**i) for i in values["islands"])
        values["tolerance"] = Tolerance(**values["tolerance"])
        values["search"] = SearchSummary(**values["search"]) if values.get("search") else None
        for key in ("unmatched_keep_fp32", "notes", "warnings"):
            values[key] = tuple(values.get(key, ()))
        return cls(**values)

    def summary_lines(self, limit: int = 12) -> list[str]:
        """The report's lines in the conversion summary (islands up to ``limit``)."""
        sources = Counter(i.source for i in self.islands)
        lines = [
            f"precision {self.precision}: {self.share:.1%} of {self.basis} in {self.dtype} "
            f"({self.low_flops / 1e6:.3g} of {self.total_flops / 1e6:.3g} MFLOP; {self.low_nodes} of "
            f"{self.float_nodes} float compute nodes); {len(self.islands)} float32 islands "
            f"({', '.join(f'{s} {n}' for s, n in sorted(sources.items())) or 'none'}); "
            f"{self.casts_added} casts added ({self.casts_after} in the graph)"
        ]
        for island in self.islands[:limit]:
            where = f" ({island.module})" if island.module else ""
            lines.append(f"          {island.source:<8} {island.op:<18} {island.node}{where}: {island.reason}")
        if len(self.islands) > limit:
            lines.append(f"          ... {len(self.islands) - limit} more islands in report.precision.islands")
        search = (
            "search not needed"
            if self.search is None
            else f"search kept {self.search.kept} of {self.search.candidates} ranked nodes in float32 "
            f"({self.search.pruned} more pruned after bisection; {self.search.builds} builds; error "
            f"{self.search.error_before:.3g} -> {self.search.error_after:.3g})"
        )
        lines.append(
            f"          calibration: {self.calibration_inputs} inputs, worst error {self.calibration_error:.3g} x "
            f"the tolerance against PyTorch fp32; {search}"
        )
        lines.extend(f"          {note}" for note in self.notes)
        lines.extend(f"          WARNING {warning}" for warning in self.warnings)
        return lines


def load_keep_fp32(path: str | Path) -> tuple[str, ...]:
    """``keep_fp32`` entries saved by :meth:`PrecisionReport.save_keep_fp32`."""
    return tuple(str(entry) for entry in json.loads(Path(path).read_text()))


def judge_share(report: PrecisionReport, share: ComputeShare, settings: Settings) -> PrecisionReport:
    """No silent degradation: little compute in the low type is a loud warning, or an error when strict."""
    if report.share >= settings.precision_min_share:
        return report
    message = (
        f"precision={report.precision!r} was asked, but only {report.share:.1%} of {report.basis} runs in "
        f"{report.dtype} (precision_min_share={settings.precision_min_share:g}); the rest stays float32. "
        f"Why: {_causes(report, share)}"
    )
    if settings.precision_strict:
        raise ConversionError(
            message,
            fix="follow the reasons above (e.g. export with a later opset), drop keep_fp32 entries, loosen the "
            f"tolerance (tolerances={{{report.dtype!r}: (atol, rtol)}}) or lower precision_min_share; "
            "precision_strict=False makes this a warning",
        )
    logger.warning("%s", message)
    return dataclasses.replace(report, warnings=(*report.warnings, message))


def _causes(report: PrecisionReport, share: ComputeShare) -> str:
    """The islands holding the float32 compute, grouped by reason (rules) or source, heaviest first."""
    by_node = {i.node: i for i in report.islands}
    weights: dict[str, float] = {}
    for node, flops in share.fp32_flops.items():
        island = by_node.get(node)
        if island is None:
            cause = "follows a float32 neighbour"
        elif island.source == "rule":
            cause = island.reason
        elif island.source == "search":
            tolerance = f"atol {report.tolerance.atol:g}, rtol {report.tolerance.rtol:g}"
            cause = f"the accuracy search, to meet the {report.dtype} tolerance ({tolerance})"
        else:
            cause = f"{island.source} islands"
        weights[cause] = weights.get(cause, 0.0) + flops
    if not weights:
        counted = Counter(i.reason for i in report.islands).most_common(3)
        return "; ".join(f"{n} x {reason}" for reason, n in counted) or "no float compute in the low type"
    total = share.total_flops or 1.0
    heaviest = sorted(weights.items(), key=lambda item: -item[1])[:3]
    return "; ".join(f"{flops / total:.0%} of FLOPs: {cause}" for cause, flops in heaviest)
