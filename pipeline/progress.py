"""Progress bars (tqdm) for the long loops a user waits on: the precision search's tries and the per-layer
comparison's chunks.

A bar is drawn only when stderr is a terminal: a CI log, a file or a pipe (stderr not a TTY) gets no bar and no
carriage-return litter, and what each step did goes to the debug log instead. ``tqdm`` is a dependency (pure Python,
no dependencies of its own), imported only when a bar is drawn.

>>> with progress(5, "precision search", unit="try") as bar:   # doctest: +SKIP
...     for _ in range(5):
...         bar.update()
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, TypeVar

T = TypeVar("T")


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stderr) is a terminal, where a progress bar may be drawn."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """One bar, or nothing off a terminal: ``update(n)`` advances it, ``status(text)`` shows what the step is."""

    def __init__(self, bar: Any | None) -> None:
        self._bar = bar

    @property
    def drawn(self) -> bool:
        """Whether a bar is on the terminal."""
        return self._bar is not None

    def update(self, steps: int = 1) -> None:
        """Advance by ``steps``."""
        if self._bar is not None:
            self._bar.update(steps)

    def status(self, text: str) -> None:
        """Show ``text`` after the bar (what the current step is doing)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def grow(self, total: int) -> None:
        """Raise the total to ``total`` (a search that learns it needs more steps)."""
        if self._bar is not None and (self._bar.total or 0) < total:
            self._bar.total = total
            self._bar.refresh()


@contextlib.contextmanager
def progress(total: int | None, description: str, *, unit: str = "step") -> Iterator[Progress]:
    """A progress bar of ``total`` steps labelled ``description`` on stderr when it is a terminal (else a
    :class:`Progress` that draws nothing); the bar is cleared when the block ends."""
    if not on_terminal():
        yield Progress(None)
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=description, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)
    try:
        yield Progress(bar)
    finally:
        bar.close()


def track(items: Iterable[T], total: int, description: str, *, unit: str = "step") -> Iterator[T]:
    """``items``, advancing a :func:`progress` bar by one as each is taken (and finished)."""
    with progress(total, description, unit=unit) as bar:
        for item in items:
            yield item
            bar.update()


@contextlib.contextmanager
def quiet_info(*loggers: logging.Logger) -> Iterator[None]:
    """Lower ``loggers`` to WARNING within the block, unless they log DEBUG: a loop's per-step INFO lines (the same
    pass summary once per candidate of a search) give way to its progress bar; ``-vv`` still shows them."""
    changed = [(log, log.level) for log in loggers if not log.isEnabledFor(logging.DEBUG)]
    for log, _ in changed:
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in changed:
            log.setLevel(level)
