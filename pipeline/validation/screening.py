"""Screening drawn validation inputs: each is run through PyTorch first, and one PyTorch itself refuses is dropped.

Draws keep what the sample shows the model requires (``draws``), but not every requirement shows on
a sample. A drawn input PyTorch raises on is left out of the comparison, loudly: a WARNING naming the torch function
(or ATen op) and PyTorch's message, and a :class:`DroppedInput` in the accuracy report. The inputs the user gave
(the sample) are never dropped: PyTorch refusing one is an InputError that says it is the user's input.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from pipeline.runtime.reports.accuracy import DroppedInput

logger = logging.getLogger(__name__)

Feed = dict[str, np.ndarray]


class AheadRunner(Protocol):
    """A PyTorch runner (validation's) that can run a feed ahead of the Comparator: ``call`` raises what
    PyTorch raises, and outputs put in ``ready`` are returned by its next ``infer``."""

    ready: dict[str, np.ndarray] | None

    def call(self, feed_dict: Feed) -> dict[str, np.ndarray]:
        """The model's outputs on one feed; whatever PyTorch raises is raised as it is."""

    def get_input_metadata(self, use_numpy_dtypes: bool = True) -> Any:
        """Polygraphy's input metadata of the runner."""


class ScreenedFeeds:
    """The feeds, each first run through PyTorch (as the Comparator would cast it): a drawn feed PyTorch refuses
    is dropped (a WARNING, and a :class:`DroppedInput` in ``dropped``); one of the first ``given`` is an
    InputError. Iterated lazily, one feed ahead of the Comparator's runners."""

    def __init__(
        self,
        feeds: list[Feed],
        runner: AheadRunner,
        given: int,
        purpose: str = "validation",
        level: int = logging.WARNING,
    ) -> None:
        if purpose not in _ADVICE:
            raise ValueError(f"purpose must be one of {sorted(_ADVICE)}, not {purpose!r}")
        self.feeds = feeds
        self.runner = runner
        self.given = given
        self.purpose = purpose  # "validation" or "calibration": what the log line says the feeds are for
        self.level = level  # of that line: DEBUG where another stage reports the same drop
        self.dropped: list[DroppedInput] = []

    def __iter__(self) -> Iterator[Feed]:
        from polygraphy.comparator.data_loader import coerce_feed_dict

        metadata = self.runner.get_input_metadata(use_numpy_dtypes=False)
        for index, feed in enumerate(self.feeds):
            coerced = coerce_feed_dict(feed, metadata)
            try:
                self.runner.ready = self.runner.call(coerced)
            except Exception as error:
                if index < self.given:  # the user's own input: an InputError that says so
                    raise refused_given_input(error, index, self.given) from error
                self.dropped.append(self._dropped(index, coerced, error))  # a drawn input: dropped, loudly
                continue
            yield feed

    def _dropped(self, index: int, feed: Feed, error: Exception) -> DroppedInput:
        dropped = DroppedInput(
            index,
            torch_function(error) or _failing_op(self.runner, feed),
            f"{type(error).__name__}: {' '.join(str(error).split())[:300]}",
        )
        logger.log(
            self.level,
            "%s input %d of %d (drawn like the sample) dropped, %s; going on with the others. %s",
            self.purpose,
            index,
            len(self.feeds),
            dropped.summary().removeprefix(f"input {index} dropped: "),
            _ADVICE[self.purpose],
        )
        return dropped


#: What to do about drawn inputs PyTorch refuses, by what they are for.
_ADVICE = {
    "validation": "To validate on inputs the model takes, give a sample whose drawn neighbours it takes, or "
    "validation_inputs=0",
    "calibration": "To calibrate on inputs the model takes, pass convert(calibration=[...])",
}


def refused_given_input(error: Exception, index: int, given: int) -> Exception:
    """The InputError for an input the user gave (one of the first ``given`` feeds) that PyTorch raises on."""
    from converters.errors import InputError

    function = torch_function(error)
    where = f" in torch function {function!r}" if function else ""
    which = "the sample you gave" if given == 1 else f"input {index} of those you gave"
    return InputError(
        f"PyTorch itself raised{where} on {which}: {type(error).__name__}: {' '.join(str(error).split())[:300]}",
        fix="call the model on that input in PyTorch to see why; give an input the model takes",
    )


def _failing_op(runner: AheadRunner, feed: Feed) -> str:
    """The ATen op that raises when ``runner``'s model runs on ``feed`` (run again, recording each op), or ""."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _LastOp(TorchDispatchMode):
        last = ""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            _LastOp.last = str(func)
            return func(*args, **(kwargs or {}))

    try:
        with _LastOp():
            runner.call(feed)
    except Exception:  # the failure is known: only where it happens is wanted
        return _LastOp.last
    return ""


def torch_function(error: BaseException) -> str:
    """The innermost public function of torch's Python code in ``error``'s traceback, or ""."""
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if "/torch/" in f.filename and "/torch/nn/modules/module.py" not in f.filename and not f.name.startswith("_")
    ]
    return frames[-1].name if frames else ""
