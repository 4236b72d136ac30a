"""What the precision stage reports (``module.report.precision``): islands with reasons, casts, the share of compute
in the low type, the calibration error and the search; and the judgement that little compute in the low type is a
loud warning, or an error under ``precision_strict``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from pathlib import Path

from converters.errors import ConversionError
from pipeline.precision.share import ComputeShare
from pipeline.runtime.reports.precision import PrecisionReport
from pipeline.settings import Settings

logger = logging.getLogger(__name__)


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
        elif island.source == "build":
            cause = f"TensorRT-RTX does not build them in {report.dtype}"
        else:
            cause = f"{island.source} islands"
        weights[cause] = weights.get(cause, 0.0) + flops
    if not weights:
        counted = Counter(i.reason for i in report.islands).most_common(3)
        return "; ".join(f"{n} x {reason}" for reason, n in counted) or "no float compute in the low type"
    total = share.total_flops or 1.0
    heaviest = sorted(weights.items(), key=lambda item: -item[1])[:3]
    return "; ".join(f"{flops / total:.0%} of FLOPs: {cause}" for cause, flops in heaviest)
