"""Writing files so that a reader sees the old file or the new one, never half of one.

A writer holds an exclusive ``flock`` on its temporary file while it writes, so the next save to the same directory
can tell a temporary file left by a killed save (nobody holds its lock: removed) from one another process is still
writing (locked: left alone). Where ``fcntl`` does not exist (Windows), a temporary file counts as stale after a day.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from converters.errors import ArtifactError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)
STALE_AFTER_SECONDS = 24 * 3600  # without fcntl only
MIN_AGE_SECONDS = 2.0


def write_file_atomically(path: Path, write: Callable[[BinaryIO], None] | bytes) -> Path:
    """Write to a temporary file beside ``path``, fsync, then rename: readers see the old file or the new one.

    An OS error (the parent is a file, ``path`` is a directory, no permission, disk full) is an
    :class:`~converters.errors.ArtifactError` that names the path and the fix; nothing is left behind.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        remove_stale_temporaries(path)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise write_error(path, exc) from exc
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when the file is closed, or when this process dies
        os.chmod(tmp_name, 0o666 & ~current_umask())  # mkstemp makes 0600; the result should look like any new file
        with os.fdopen(fd, "wb") as handle:
            if isinstance(write, bytes):
                handle.write(write)
            else:
                write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            os.replace(tmp_name, path)  # before the lock goes: a cleaner never sees an unlocked, unfinished file
    except OSError as exc:
        Path(tmp_name).unlink(missing_ok=True)
        raise write_error(path, exc) from exc
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files of earlier saves of ``path`` whose writer died (see the module doc)."""
    removed = []
    for candidate in path.parent.glob(f".{path.name}.*.tmp"):
        if _is_stale(candidate):
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    if removed:
        logger.info("removed %d temporary file(s) left by an interrupted save of %s", len(removed), path)
    return removed


def _is_stale(candidate: Path) -> bool:
    try:
        age = time.time() - candidate.stat().st_mtime
        if fcntl is None or age < MIN_AGE_SECONDS:  # young: its writer may not have taken the lock yet
            return age > STALE_AFTER_SECONDS
        fd = os.open(candidate, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # another process holds it: a save in progress
    finally:
        os.close(fd)
    return True


def write_error(path: Path, exc: OSError) -> ArtifactError:
    """The ArtifactError for ``exc``, raised writing ``path``: the OS's reason and the fix for the likely cause."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, IsADirectoryError) and Path(path).is_dir():
        fix = f"{path} is a directory: give a file path inside it, e.g. {Path(path) / 'model.ptrt'}"
    elif isinstance(exc, (NotADirectoryError, FileExistsError)) or not Path(path).parent.is_dir():
        fix = f"a part of {path.parent} is a file, not a directory: choose another location"
    elif isinstance(exc, PermissionError):
        fix = f"{path.parent} is not writable by this user: choose a writable location"
    elif exc.errno == errno.ENOSPC:
        fix = f"the disk holding {path.parent} is full: free space or choose another location"
    else:
        fix = "choose a path on a writable, local file system"
    return ArtifactError(f"cannot write {path}: {reason}", fix=fix)


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back: Python has no plain getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
