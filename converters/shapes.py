"""Dynamic dimensions and optimization profiles: ``dynamic=`` and ``profiles=`` of
:class:`converters.settings.Settings` (which re-exports :class:`DynamicDim` and :class:`ProfileRange`), read and
checked here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from converters.errors import InputError


@dataclass(frozen=True)
class ProfileRange:
    """One dynamic dimension's (min, opt, max) in one optimization profile (``profiles=``)."""

    name: str
    min: int
    opt: int
    max: int


def normalise_profiles(profiles: Any, dims: tuple[DynamicDim, ...]) -> tuple[tuple[ProfileRange, ...], ...]:
    """``profiles=[{"sequence": (1, 64, 256)}, {"sequence": (1, 1, 1)}]`` as ranges, each within the dimension's
    declared range (the graph's)."""
    example = "profiles=[{'sequence': (1, 64, 256)}, {'sequence': (1, 1, 1)}] (dimension name -> (min, opt, max))"
    declared = {d.name: d for d in dims}
    out = []
    for profile in profiles or ():
        items = (
            profile.items()
            if isinstance(profile, Mapping)
            else ((r["name"] if isinstance(r, Mapping) else r.name, r) for r in profile)
        )
        ranges = []
        for name, spec in items:
            if isinstance(spec, Mapping):
                spec = (spec["min"], spec["opt"], spec["max"])
            elif isinstance(spec, ProfileRange):
                spec = (spec.min, spec.opt, spec.max)
            try:
                lo, opt, hi = (whole(v) for v in spec)
            except (TypeError, ValueError):
                raise InputError(
                    f"profile range for {name!r} must be (min, opt, max), got {spec!r}", fix=example
                ) from None
            dim = declared.get(str(name))
            if dim is None:
                raise InputError(
                    f"profiles name dimension {name!r}, which dynamic= does not declare",
                    fix=f"name one of: {', '.join(sorted(declared)) or '(none: declare dynamic= first)'}",
                )
            if not dim.min <= lo <= opt <= hi <= dim.max:
                raise InputError(
                    f"profile range {name!r}: {(lo, opt, hi)} is not min <= opt <= max within the declared "
                    f"({dim.min}, {dim.max})",
                    fix=example,
                )
            ranges.append(ProfileRange(str(name), lo, opt, hi))
        out.append(tuple(ranges))
    return tuple(out)


def profile_dims(
    dims: tuple[DynamicDim, ...], profiles: tuple[tuple[ProfileRange, ...], ...]
) -> list[tuple[DynamicDim, ...]]:
    """The dynamic dimensions of each optimization profile, in order: each profile's ranges over the declared ones
    (a dimension it does not name keeps its declared range); one profile, ``dims``, when none is declared."""
    if not profiles:
        return [dims]
    out = []
    for ranges in profiles:
        by_name = {r.name: r for r in ranges}
        out.append(
            tuple(
                dataclasses.replace(d, min=r.min, opt=r.opt, max=r.max) if (r := by_name.get(d.name)) else d
                for d in dims
            )
        )
    return out


@dataclass(frozen=True)
class DynamicDim:
    """One dynamic dimension of one graph input: its symbolic name and the engine profile (min, opt, max).

    Inputs that share a ``name`` share the dimension (``input_ids`` and ``attention_mask`` share ``batch``).
    ``multiple``: every size is a multiple of it (a UNet's latent height halves at each down block); the export
    finds it when the model needs it (``pipeline.exporting.multiples``).
    """

    input: str
    axis: int
    name: str
    min: int
    opt: int
    max: int
    multiple: int = 1

    def __post_init__(self) -> None:
        if self.multiple < 1:
            raise InputError(
                f"dynamic dimension {self.name!r}: multiple must be >= 1, got {self.multiple}",
                fix="give a positive multiple (1: any size)",
            )
        if not (1 <= self.min <= self.opt <= self.max):
            raise InputError(
                f"dynamic dimension {self.name!r} of input {self.input!r} axis {self.axis} needs "
                f"1 <= min <= opt <= max, got min={self.min} opt={self.opt} max={self.max}",
                fix="give (name, min, opt, max) with min <= opt <= max, e.g. ('batch', 1, 8, 32)",
            )


def normalise_dynamic(dynamic: Any) -> tuple[DynamicDim, ...]:
    """``dynamic=`` as given (input -> axis -> (name, min, opt, max), or DynamicDims) as a tuple of
    :class:`DynamicDim`, one range per shared dimension name."""
    if isinstance(dynamic, tuple) and all(isinstance(d, DynamicDim) for d in dynamic):
        dims = dynamic
    elif isinstance(dynamic, Mapping):
        dims = tuple(
            _dim_from_user(str(inp), axis, spec) for inp, axes in dynamic.items() for axis, spec in dict(axes).items()
        )
    else:
        raise InputError(
            f"cannot read dynamic={dynamic!r}",
            fix="pass dynamic={'x': {0: ('batch', 1, 8, 32)}} (input -> axis -> (name, min, opt, max))",
        )
    by_name: dict[str, DynamicDim] = {}
    for d in dims:
        first = by_name.setdefault(d.name, d)
        if (first.min, first.opt, first.max) != (d.min, d.opt, d.max):
            raise InputError(
                f"dynamic dimension {d.name!r} is declared with two ranges: "
                f"{(first.min, first.opt, first.max)} on {first.input!r} and {(d.min, d.opt, d.max)} on {d.input!r}",
                fix="a shared dimension name must have one (min, opt, max)",
            )
    return dims


def _dim_from_user(inp: str, axis: Any, spec: Any) -> DynamicDim:
    if isinstance(spec, DynamicDim):
        return spec
    example = f"dynamic={{{inp!r}: {{0: ('batch', 1, 8, 32)}}}}"
    try:
        name, lo, opt, hi = spec
        axis, lo, opt, hi = (whole(v) for v in (axis, lo, opt, hi))
    except (TypeError, ValueError):
        raise InputError(
            f"dynamic dimension for input {inp!r} axis {axis!r} must be (name, min, opt, max) with whole numbers "
            f"and an integer axis, got {spec!r}",
            fix=f"write e.g. {example}",
        ) from None
    return DynamicDim(inp, axis, str(name), lo, opt, hi)


def whole(value: Any) -> int:
    """An int from an int (or a numpy integer); anything else (``"one"``, 1.5, True) is a ValueError."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(value)
    return int(value.__index__())
