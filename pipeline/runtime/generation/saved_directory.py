"""A generation module saved as a directory of artifacts (an encoder-decoder's, a vision-language model's, a recurrent
model's step and prompt graph), written atomically: a new directory renamed into place."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from converters.errors import InputError
from converters.files import write_error


def save_directory(path: str | Path, files: tuple[str, ...], write: Callable[[Path], None], what: str) -> Path:
    """Write the directory ``path`` holding ``files`` (``write(staging)`` writes them), atomically: a new directory
    renamed into place (a directory already there is replaced only once the new one is complete). ``what`` names the
    module in the errors ("an encoder-decoder", "a vision-language model")."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise InputError(
            f"{target} exists and is not a directory: {what} saves as a directory of {', '.join(files)}",
            fix="pass a new path, or a directory its save wrote",
        )
    if target.is_dir() and any(p.name not in files for p in target.iterdir()):
        raise InputError(
            f"{target} holds other files than {what}'s {', '.join(files)}", fix="save into a new or empty directory"
        )
    staging = target.with_name(f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()  # the umask's mode, as a file's save has (a temporary directory's 0700 would hide it)
    except OSError as exc:
        raise write_error(target, exc) from exc
    old = None
    try:
        write(staging)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(staging, target)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None and not target.exists():  # the new one never took its place: the old one back
            os.replace(old, target)
        if isinstance(exc, OSError):
            raise write_error(target, exc) from exc
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target
