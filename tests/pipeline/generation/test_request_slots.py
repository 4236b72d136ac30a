"""Request slots (``pipeline.runtime.generation.slots``) driven directly, with stand-in runners and real threads: no
model is converted, so the whole file runs in about a second (the mutation run's judge of the module; the converted
modules' concurrency is tests/pipeline/module/test_concurrency.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from converters.errors import InputError
from pipeline.runtime.generation.slots import DEFAULT_SLOTS, RequestSlots, RequestSlotsBusy

#: How long a test waits for another thread before it calls the wait a hang.
PATIENCE = 10.0


class Runners:
    """A runner factory that counts what it made (the runners are plain objects: the slots never call them)."""

    def __init__(self) -> None:
        self.made: list[object] = []

    def __call__(self) -> Any:
        runner = object()
        self.made.append(runner)
        return runner


class Holder:
    """A thread that holds ``count`` slots (nested ``hold()``s) until told to let go, and records what happened."""

    def __init__(self, slots: RequestSlots, count: int = 1) -> None:
        self.slots, self.count = slots, count
        self.holding, self.release = threading.Event(), threading.Event()
        self.runners: list[Any] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self._nested(self.count):
                self.holding.set()
                assert self.release.wait(PATIENCE)
        except BaseException as exc:  # the test thread reads it
            self.error = exc
            self.holding.set()

    @contextmanager
    def _nested(self, count: int) -> Iterator[None]:
        if not count:
            yield
            return
        with self.slots.hold() as runner:
            self.runners.append(runner)
            with self._nested(count - 1):
                yield

    def start(self) -> Holder:
        self.thread.start()
        assert self.holding.wait(PATIENCE)
        return self

    def stop(self) -> None:
        self.release.set()
        self.thread.join(PATIENCE)
        assert not self.thread.is_alive()


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, "the other thread never got there"
        time.sleep(0.005)


def test_the_default_is_four_slots_and_a_slot_count_is_a_positive_int() -> None:
    slots = RequestSlots(Runners())
    assert DEFAULT_SLOTS == 4 and slots.slots == 4 and slots.timeout is None and slots.held == 0
    slots.slots = 1
    assert slots.slots == 1
    for bad in (0, -1, True, False, 2.0, "2", None):
        with pytest.raises(InputError, match=r"request_slots must be a positive int, got ") as info:
            slots.slots = bad
        assert repr(bad) in str(info.value) and "module.request_slots = 8" in str(info.value)
    assert slots.slots == 1
    with pytest.raises(InputError, match="positive int"):
        RequestSlots(Runners(), slots=0)


def test_a_runner_is_made_when_first_needed_and_kept_for_the_next_request() -> None:
    runners = Runners()
    slots = RequestSlots(runners, slots=2)
    assert runners.made == []
    with slots.hold() as first:
        assert slots.held == 1 and runners.made == [first]
        with slots.hold() as second:  # the same thread may hold several (open streams)
            assert slots.held == 2 and second is not first and runners.made == [first, second]
        assert slots.held == 1
    assert slots.held == 0
    with slots.hold() as again, slots.hold() as other:
        assert {id(again), id(other)} == {id(first), id(second)}  # reused, none made
    assert len(runners.made) == 2


def test_fewer_slots_drop_the_idle_runners_beyond_them() -> None:
    runners = Runners()
    slots = RequestSlots(runners, slots=3)
    with slots.hold(), slots.hold(), slots.hold():
        slots.slots = 1
    with slots.hold():
        pass
    assert len(runners.made) == 3  # one of the three idle runners kept, used again
    slots.slots = 2
    with slots.hold(), slots.hold():
        pass
    assert len(runners.made) == 4  # the second slot needs a runner again: the others were dropped


def test_an_idle_runner_is_kept_only_while_the_slots_have_room_for_it() -> None:
    """Released into a pool of one slot while another request still holds the other: the pool is full, dropped."""
    runners = Runners()
    slots = RequestSlots(runners, slots=2)
    with slots.hold() as outer:  # noqa: SIM117 -- the outer request outlives the inner one
        with slots.hold() as inner:
            slots.slots = 1
        # idle 0 + held 1 == 1 slot: the inner runner is not kept
    with slots.hold() as again:
        assert again is outer and again is not inner
    assert len(runners.made) == 2  # the outer runner was kept (idle 0 + held 0 < 1), and served this request


def test_a_runner_that_cannot_be_made_gives_its_slot_back() -> None:
    def broken() -> Any:
        raise RuntimeError("no engine")

    slots = RequestSlots(broken, slots=1)
    for _ in range(2):  # the slot is free again: the second attempt fails the same way, not with RequestSlotsBusy
        with pytest.raises(RuntimeError, match="no engine"), slots.hold():
            pass
        assert slots.held == 0


def test_a_request_waits_for_a_slot_another_thread_gives_back() -> None:
    runners = Runners()
    slots = RequestSlots(runners, slots=1)
    holder = Holder(slots).start()
    got: list[Any] = []

    def request() -> None:
        with slots.hold() as runner:
            got.append(runner)

    waiter = threading.Thread(target=request, daemon=True)
    waiter.start()
    wait_until(lambda: bool(slots._waiting))
    assert not got and slots.held == 1
    holder.stop()
    waiter.join(PATIENCE)
    assert got == holder.runners and len(runners.made) == 1 and slots.held == 0 and not slots._waiting


def test_a_request_that_waits_past_the_timeout_fails_clearly() -> None:
    slots = RequestSlots(Runners(), slots=2, timeout=0.2)
    holder = Holder(slots, count=2).start()
    try:
        started = time.monotonic()
        with pytest.raises(RequestSlotsBusy) as info, slots.hold():
            pass
        waited = time.monotonic() - started
        assert 0.15 <= waited < 5, waited
        assert str(info.value) == (
            "[input] all 2 request slots of the module stayed held for 0.2 s (requests generating, or stream() "
            "generators left open)\n  fix: raise module.request_slots (each slot holds one request's cache), or "
            "module.request_timeout, or close streams that are no longer read"
        )
        assert isinstance(info.value, InputError)
        assert slots.held == 2 and not slots._waiting
    finally:
        holder.stop()
    assert slots.held == 0


def test_a_request_that_finds_a_free_slot_does_not_wait_even_with_no_time_left() -> None:
    slots = RequestSlots(Runners(), slots=2, timeout=0.0)
    holder = Holder(slots).start()
    try:
        with slots.hold():
            assert slots.held == 2
    finally:
        holder.stop()


def test_a_thread_that_holds_every_slot_is_refused_at_once() -> None:
    slots = RequestSlots(Runners(), slots=2)
    with slots.hold(), slots.hold():
        started = time.monotonic()
        with pytest.raises(RequestSlotsBusy) as info, slots.hold():
            pass
        assert time.monotonic() - started < 1
        assert str(info.value) == (
            "[input] this thread already holds all 2 request slots of the module (unfinished stream() generators): "
            "a new request would wait for itself forever\n  fix: finish or close() a stream before starting another, "
            "or raise module.request_slots"
        )
        assert slots.held == 2
    assert slots.held == 0


def test_threads_that_each_wait_for_another_slot_are_refused_instead_of_deadlocking() -> None:
    """This thread and another hold a slot each of two; the other asks for a second one and waits; this one asking
    too would wait for ever: it is refused, and once it lets go the other gets its slot."""
    slots = RequestSlots(Runners(), slots=2, timeout=PATIENCE / 4)
    # a thread that held a slot and gave it back (still alive: its id is not reused) is no holder any more: it must
    # not make the deadlock look passable
    gave_back, finish = threading.Event(), threading.Event()

    def use_once() -> None:
        with slots.hold():
            pass
        gave_back.set()
        finish.wait(PATIENCE)

    former = threading.Thread(target=use_once, daemon=True)
    former.start()
    try:
        assert gave_back.wait(PATIENCE) and slots.held == 0
        other = Holder(slots, count=2)
        with slots.hold():
            other.thread.start()
            wait_until(lambda: bool(slots._waiting))
            assert slots.held == 2
            started = time.monotonic()
            with pytest.raises(RequestSlotsBusy) as info, slots.hold():
                pass
            assert time.monotonic() - started < 1
            assert str(info.value) == (
                "[input] the 2 request slots of the module are held by threads (2, this one included) that each wait "
                "for another slot (several open stream() generators per thread): none would ever get one\n  fix: "
                "raise module.request_slots to at least the streams open at once, or finish a stream before opening "
                "the next"
            )
        assert other.holding.wait(PATIENCE) and other.error is None and slots.held == 2
        other.stop()
        assert slots.held == 0
    finally:
        finish.set()
        former.join(PATIENCE)


def test_a_waiting_thread_holding_nothing_is_not_a_deadlock() -> None:
    """A thread that holds no slot waits for one (it is no holder: the deadlock rule does not apply to it)."""
    slots = RequestSlots(Runners(), slots=1, timeout=0.2)
    holder = Holder(slots).start()
    try:
        with pytest.raises(RequestSlotsBusy, match="stayed held"), slots.hold():
            pass
    finally:
        holder.stop()


def test_a_holder_still_waited_for_is_no_deadlock() -> None:
    """Two threads of three slots: one holds two and waits for nothing; the other holds one and asks for more: it
    waits (the first is not waiting), and gets a slot when the first lets go."""
    slots = RequestSlots(Runners(), slots=3)
    holder = Holder(slots, count=2).start()
    got = threading.Event()

    def request() -> None:
        with slots.hold(), slots.hold():
            got.set()

    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    wait_until(lambda: bool(slots._waiting))
    assert not got.is_set() and slots.held == 3
    holder.stop()
    thread.join(PATIENCE)
    assert got.is_set() and slots.held == 0


def test_a_slot_given_back_wakes_every_waiter() -> None:
    """notify_all: two waiters for one slot each, both served as the holder gives back two."""
    slots = RequestSlots(Runners(), slots=2)
    holder = Holder(slots, count=2).start()
    done: list[int] = []

    def request(index: int) -> None:
        with slots.hold():
            done.append(index)

    threads = [threading.Thread(target=request, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(slots._waiting) == 2)
    holder.stop()
    for thread in threads:
        thread.join(PATIENCE)
    assert sorted(done) == [0, 1] and slots.held == 0
