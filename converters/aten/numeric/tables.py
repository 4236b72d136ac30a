"""Coefficient tables the special-function converters evaluate, kept as data (``data/*.json``) and read once.

``cephes(name)`` is one of the Cephes arrays of PyTorch's ``ATen/native/Math.h`` (``I0_A``, ``NDTRI_P0``, ...);
``erfcx_y100()`` is the 100 x 7 table of ``calc_erfcx``. Each file says where its numbers come from.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.cache
def _load(name: str) -> Any:
    return json.loads(resources.files("converters.aten.numeric").joinpath("data", name).read_text(encoding="utf-8"))


def cephes(name: str) -> tuple[float, ...]:
    """The Cephes coefficient array ``name``, highest power first, as ``Math.h`` lists it."""
    return tuple(_load("cephes.json")["tables"][name])


def erfcx_y100() -> tuple[tuple[float, ...], ...]:
    """Rows ``c0 .. c6`` of ``erfcx_y100``, one per interval ``[k, k + 1)`` of ``y100``."""
    return tuple(tuple(row) for row in _load("erfcx_y100.json")["table"])
