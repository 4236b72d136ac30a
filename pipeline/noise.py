"""Third-party chatter kept off a default run: what torch's exporter, onnxscript's optimizer and onnx_ir log or warn
while a model is exported (onnxscript's "Evaluation failed: cannot reshape array ..." on every BERT, for one) is
not the user's business unless they ask.

They ask with ``pipeline -v`` (the CLI sets the ``pipeline.third_party`` logger to DEBUG), or by putting that logger,
or ``pipeline`` as a whole, at DEBUG from Python: ``logging.getLogger("pipeline").setLevel(logging.DEBUG)``.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

#: The logger whose level says whether third-party messages are shown (DEBUG: they are).
THIRD_PARTY_LOGGER = "pipeline.third_party"
#: The third-party loggers quieted while our stages call into them.
NOISY_LOGGERS = ("torch.onnx", "onnxscript", "onnx_ir")


def third_party_shown() -> bool:
    """Whether third-party logs and warnings reach the user (``pipeline -v``, or our loggers at DEBUG)."""
    return logging.getLogger(THIRD_PARTY_LOGGER).isEnabledFor(logging.DEBUG)


def show_third_party(shown: bool = True) -> None:
    """Let third-party logs and warnings through (``pipeline -v`` calls this), or keep them quiet again."""
    logging.getLogger(THIRD_PARTY_LOGGER).setLevel(logging.DEBUG if shown else logging.NOTSET)


@contextlib.contextmanager
def quiet_third_party() -> Iterator[None]:
    """Within the block, :data:`NOISY_LOGGERS` log errors only and Python warnings are not shown, unless
    :func:`third_party_shown`. Our own warnings are raised outside such blocks, so they still reach the user."""
    if third_party_shown():
        yield
        return
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)
