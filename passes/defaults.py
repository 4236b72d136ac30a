"""The default pass list, built by an explicit function (never by import side effects)."""

from __future__ import annotations

from passes.base import GraphPass
from passes.cleanup import RemoveDeadNodes, RemoveIdentities, TopologicalSort
from passes.folding import FoldConstants


def default_passes() -> tuple[GraphPass, ...]:
    """The passes every conversion runs, in order. Later stages (lowering, precision) add to this list."""
    return (RemoveIdentities(), RemoveDeadNodes(), FoldConstants(), TopologicalSort())
