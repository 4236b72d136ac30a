"""A generation module saved as a directory of artifacts (an encoder-decoder's, a vision-language model's, a recurrent
model's step and prompt graph), written atomically: a new directory renamed into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from converters.errors import InputError


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
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(staging)
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(staging, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
