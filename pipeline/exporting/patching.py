"""A method of a third-party class replaced for the duration of ``with`` blocks, shared by every block open at once
(exports may run in threads): installed by the first block, restored by the last."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class SharedPatch:
    """``owner.name`` replaced by ``wrap(original)`` while at least one :meth:`held` block is open."""

    def __init__(self, owner: Any, name: str, wrap: Callable[[Any], Any]) -> None:
        self.owner, self.name, self.wrap = owner, name, wrap
        self._lock = threading.Lock()
        self._holders = 0
        self._original: Any = None

    @contextmanager
    def held(self) -> Iterator[None]:
        """The replacement is in place within the block."""
        with self._lock:
            if self._holders == 0:
                self._original = self.owner.__dict__[self.name]
                setattr(self.owner, self.name, self.wrap(self._original))
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    setattr(self.owner, self.name, self._original)
