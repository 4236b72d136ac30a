"""The collector is off inside ``gc_paused`` and as it was after; ``promote`` moves what the block built to the oldest
generation, and leaves the application's frozen objects alone."""

from __future__ import annotations

import gc

import pytest

from passes.model_io.gc_pause import gc_paused


class Node:
    pass


def in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation=generation))


def test_collector_off_inside_and_back_on_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not turn it back on
    assert gc.isenabled()


def test_collector_the_application_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused(promote=True):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_collector_back_on_after_an_error() -> None:
    with pytest.raises(ValueError), gc_paused(promote=True):
        raise ValueError("boom")
    assert gc.isenabled()


def test_promote_moves_what_was_built_to_the_oldest_generation() -> None:
    with gc_paused(promote=True):
        built = Node()
        built.me = built  # type: ignore[attr-defined]  # a cycle, as every graph-surgeon object is in
        assert in_generation(built, 0)
    assert in_generation(built, 2)
    assert gc.get_freeze_count() == 0


def test_promote_leaves_frozen_objects_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused(promote=True):
            built = Node()
        # still frozen (not unfrozen, none added); a frozen object that died meanwhile (another thread's) leaves it
        assert 0 < gc.get_freeze_count() <= frozen
        assert not in_generation(built, 2)  # young (a collection since may have moved it to the middle one)
    finally:
        gc.unfreeze()
