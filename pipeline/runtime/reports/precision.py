"""The precision stage's record (``module.report.precision``): the float32 islands, casts, the low-precision share
and the error the stage measured."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from passes.records import Island
from pipeline.settings import Tolerance

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
