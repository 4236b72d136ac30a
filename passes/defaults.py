"""The default pass list, built by an explicit function (never by import side effects)."""

from __future__ import annotations

from converters.registry import ConverterRegistry
from passes.base import GraphPass
from passes.cleanup import RemoveDeadNodes, RemoveIdentities, TopologicalSort
from passes.folding import FoldConstants
from passes.lowering import LowerCustomOps
from passes.squeeze_axes import ExplicitSqueezeAxes


def default_passes(converters: ConverterRegistry | None = None) -> tuple[GraphPass, ...]:
    """The passes every conversion runs, in order: lowering with ``converters`` (when given) first, then cleanup,
    constant folding and topological sort."""
    lowering: tuple[GraphPass, ...] = () if converters is None else (LowerCustomOps(converters),)
    return (
        *lowering,
        RemoveIdentities(),
        RemoveDeadNodes(),
        FoldConstants(),
        ExplicitSqueezeAxes(),
        TopologicalSort(),
    )
