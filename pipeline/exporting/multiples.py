"""Dynamic dimensions a model needs to be multiples of a number, found by torch.export and declared to it.

A UNet halves its latent at each down block and doubles it again on the way up: torch.export refuses
``height`` in [8, 16] because the model guards ``height % 2 == 0``, and suggests ``height = 2*_height``. The
declared dimension then becomes a multiple of 2 (its range rounded inwards to multiples), the export is run again
with ``2 * Dim('_height')``, and a WARNING says that sizes which are not multiples are refused: a call at such a
size is an InputError before anything runs (``ConvertedModule``), not a wrong result.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from typing import Any

import torch

from converters.errors import InputError
from pipeline.settings import DynamicDim

logger = logging.getLogger(__name__)

# "height = 2*_height" in torch.export's "Suggested fixes:" (a derived Dim with no offset)
_MULTIPLE_FIX = re.compile(r"^\s*(\w+) = (\d+)\*(\w+)\s*$", re.MULTILINE)


def torch_dims(dims: tuple[DynamicDim, ...]) -> dict[str, Any]:
    """One ``torch.export.Dim`` per dimension name: ``multiple * Dim('_name')`` for a multiple above 1."""
    out: dict[str, Any] = {}
    for d in dims:
        if d.name in out:
            continue
        if d.multiple == 1:
            out[d.name] = torch.export.Dim(d.name, min=d.min, max=d.max)
        else:
            root = torch.export.Dim(f"_{d.name}", min=d.min // d.multiple, max=d.max // d.multiple)
            out[d.name] = d.multiple * root
    return out


def multiples_from(exc: BaseException, dims: tuple[DynamicDim, ...]) -> tuple[DynamicDim, ...] | None:
    """``dims`` with the multiples torch.export's constraint error suggests, or None when it suggests none that
    can be declared (another kind of error, an offset, a dimension not declared)."""
    text = str(exc)
    if "Constraints violated" not in text or "Suggested fixes" not in text:
        return None
    found = {name: int(k) for name, k, _root in _MULTIPLE_FIX.findall(text.split("Suggested fixes", 1)[1])}
    names = {d.name for d in dims}
    if not found or not set(found) <= names:
        return None
    return tuple(_as_multiple(d, found[d.name]) if d.name in found else d for d in dims)


def warn_multiples(before: tuple[DynamicDim, ...], after: tuple[DynamicDim, ...]) -> None:
    """One WARNING naming each dimension that became a multiple, and why (sizes between are refused)."""
    changed = {a.name: (b, a) for b, a in zip(before, after, strict=True) if a != b}
    if not changed:
        return
    logger.warning(
        "export: the model needs %s (torch.export's guards); exported so, and calls at other sizes are refused "
        "with an InputError",
        "; ".join(
            f"{name!r} a multiple of {a.multiple} (declared [{b.min}, {b.max}], now [{a.min}, {a.max}])"
            for name, (b, a) in changed.items()
        ),
    )


def _as_multiple(d: DynamicDim, k: int) -> DynamicDim:
    multiple = math.lcm(d.multiple, k)
    lo, hi = -(-d.min // multiple) * multiple, d.max // multiple * multiple
    if lo > hi:
        raise InputError(
            f"dynamic dimension {d.name!r} of input {d.input!r}: the model needs a multiple of {multiple}, and the "
            f"declared range [{d.min}, {d.max}] holds none",
            fix=f"declare a range that holds multiples of {multiple}, e.g. ({d.name!r}, {multiple}, "
            f"{multiple}, {2 * multiple})",
        )
    opt = min(max(round(d.opt / multiple) * multiple, lo), hi)
    return dataclasses.replace(d, min=lo, opt=opt, max=hi, multiple=multiple)
