"""Request slots: each generation request has a step runner (and so a cache) of its own while it runs.

A runner holds one request's key/value cache between steps (:mod:`pipeline.runtime.generation.runners`), so two
requests must never share one: the tokens of each would be decoded over the other's cache. A module keeps a pool of
runners, at most ``slots`` of them; ``generate`` and each ``stream()`` generator hold one from their first step to
their last (a generator that is closed, or dropped, gives it back). A request that finds every slot held waits for
one, up to ``timeout`` seconds (default: as long as it takes), then fails with :class:`RequestSlotsBusy`. Where waiting
could never end it fails at once: a thread that itself holds every slot (its own unfinished ``stream()`` generators),
or threads that each hold slots and all wait for one more.

Runners are made when first needed and kept for the next request: their buffers are made again at each request's
start (:meth:`StepRunner.start`), so an idle slot keeps at most the cache of the last request it served.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from converters.errors import InputError
from pipeline.runtime.generation.runners import StepRunner

#: How many requests of one module may generate at once unless the module is told otherwise.
DEFAULT_SLOTS = 4


class RequestSlotsBusy(InputError):
    """Every request slot of a generative module is held (by other requests, or by this thread's own streams)."""


class RequestSlots:
    """At most ``slots`` step runners, each held by one request at a time (see the module docstring)."""

    def __init__(
        self, make: Callable[[], StepRunner | None], slots: int = DEFAULT_SLOTS, timeout: float | None = None
    ) -> None:
        self._make = make
        self._idle: list[StepRunner] = []
        self._holders: dict[int, int] = {}  # thread id -> slots it holds
        self._waiting: set[int] = set()  # threads waiting for a slot
        self._free = threading.Condition()
        self.slots = slots
        self.timeout = timeout

    @property
    def slots(self) -> int:
        """The most requests that generate at once."""
        return self._slots

    @slots.setter
    def slots(self, value: int) -> None:
        """Allow ``value`` requests at once (a positive int)."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(
                f"request_slots must be a positive int, got {value!r}",
                fix="pass the number of requests that may generate at once, e.g. module.request_slots = 8",
            )
        self._slots = value

    @property
    def held(self) -> int:
        """How many slots requests hold now."""
        with self._free:
            return sum(self._holders.values())

    @contextlib.contextmanager
    def hold(self) -> Iterator[StepRunner | None]:
        """A runner of the caller's own until the block ends."""
        me = threading.get_ident()  # the holder, even when another thread closes the generator that holds it
        runner = self._acquire(me)
        try:
            yield runner
        finally:
            self._release(runner, me)

    def _acquire(self, me: int) -> StepRunner | None:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        with self._free:
            while sum(self._holders.values()) >= self.slots:
                self._refuse_deadlock(me)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RequestSlotsBusy(
                        f"all {self.slots} request slots of the module stayed held for {self.timeout} s (requests "
                        "generating, or stream() generators left open)",
                        fix="raise module.request_slots (each slot holds one request's cache), or "
                        "module.request_timeout, or close streams that are no longer read",
                    )
                self._waiting.add(me)
                try:
                    self._free.wait(left)
                finally:
                    self._waiting.discard(me)
            self._holders[me] = self._holders.get(me, 0) + 1  # counted first: no other thread takes the slot
            if self._idle:
                return self._idle.pop()
            try:
                return self._make()
            except BaseException:
                self._release(None, me)
                raise

    def _refuse_deadlock(self, me: int) -> None:
        """Waiting would never end when every slot is held by threads that wait here themselves (this one
        included): each waits for a slot only another waiter could give back."""
        if me not in self._holders:
            return
        if self._holders[me] >= self.slots:
            raise RequestSlotsBusy(
                f"this thread already holds all {self.slots} request slots of the module (unfinished stream() "
                "generators): a new request would wait for itself forever",
                fix="finish or close() a stream before starting another, or raise module.request_slots",
            )
        if all(holder == me or holder in self._waiting for holder in self._holders):
            raise RequestSlotsBusy(
                f"the {self.slots} request slots of the module are held by threads ({len(self._holders)}, this one "
                "included) that each wait for another slot (several open stream() generators per thread): none "
                "would ever get one",
                fix="raise module.request_slots to at least the streams open at once, or finish a stream before "
                "opening the next",
            )

    def _release(self, runner: StepRunner | None, me: int) -> None:
        with self._free:
            self._holders[me] -= 1
            if not self._holders[me]:
                del self._holders[me]
            if runner is not None and len(self._idle) + sum(self._holders.values()) < self.slots:
                self._idle.append(runner)  # kept for the next request (dropped when the slots were made fewer)
            self._free.notify_all()
