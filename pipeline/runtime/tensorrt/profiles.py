"""Optimization profiles: the (min, opt, max) shapes of every dynamic input, one set per profile.

``settings.profiles`` empty: one profile from the declared dynamic dimensions. Otherwise one profile per entry, each
overriding the ranges of the dimensions it names (a cached decoder step: a context profile with the prompt's
sequence range and a generation profile with sequence 1). The runtime picks the first profile that holds a call's
shapes (:func:`choose_profile`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from converters.shapes import profile_dims
from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import Settings

Shape = tuple[int, ...]
ProfileShapes = dict[str, tuple[Shape, Shape, Shape]]


def profiles_shapes(io: IOSpec, settings: Settings) -> list[ProfileShapes]:
    """The shapes of every profile, in order."""
    return [
        profile_shapes(io, dataclasses.replace(settings, dynamic=dims, profiles=()))
        for dims in profile_dims(settings.dynamic, settings.profiles)
    ]


def optimization_profiles(io: IOSpec, settings: Settings) -> list[Any]:
    """Polygraphy ``Profile`` objects, one per profile."""
    from polygraphy.backend.trt import Profile

    profiles = []
    for shapes in profiles_shapes(io, settings):
        profile = Profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.add(name, min=lo, opt=opt, max=hi)
        profiles.append(profile)
    return profiles


def choose_profile(profiles: Sequence[Mapping[str, tuple[Shape, Shape, Shape]]], shapes: Mapping[str, Shape]) -> int:
    """The index of the first profile whose ranges hold ``shapes`` (input name -> shape); -1 when none does."""
    for index, profile in enumerate(profiles):
        if all(
            name not in profile
            or all(a <= s <= b for s, a, b in zip(shape, profile[name][0], profile[name][2], strict=True))
            for name, shape in shapes.items()
        ):
            return index
    return -1


def profile_shapes(io: IOSpec, settings: Settings) -> ProfileShapes:
    """(min, opt, max) shapes of every input with a declared dynamic dimension (``settings.dynamic``, one profile);
    fixed axes keep their size."""
    shapes = {}
    for spec in io.inputs:
        dims = settings.dims_of(spec.name)
        if dims:
            lo, opt, hi = (
                tuple(getattr(dims[a], which) if a in dims else int(s) for a, s in enumerate(spec.shape))
                for which in ("min", "opt", "max")
            )
            shapes[spec.name] = (lo, opt, hi)
    return shapes
