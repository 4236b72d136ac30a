"""Atomic writes: clear errors for impossible paths, nothing half-written, stale temporaries of killed saves removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from converters.errors import ArtifactError
from converters.files import write_file_atomically

ROOT = Path(__file__).resolve().parents[2]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_parent_that_is_a_file_is_an_artifact_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match="is a file, not a directory") as info:
        write_file_atomically(tmp_path / "file" / "model.ptrt", b"data")
    assert "fix:" in str(info.value)
    assert leftovers(tmp_path) == []


def test_target_that_is_a_directory_is_an_artifact_error(tmp_path: Path) -> None:
    (tmp_path / "model.ptrt").mkdir()
    with pytest.raises(ArtifactError, match="is a directory: give a file path inside it"):
        write_file_atomically(tmp_path / "model.ptrt", b"data")
    assert leftovers(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_is_an_artifact_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ArtifactError, match="not writable"):
            write_file_atomically(tmp_path / "model.ptrt", b"data")
    finally:
        tmp_path.chmod(0o700)


def test_writer_error_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = write_file_atomically(tmp_path / "m.bin", b"old")

    def fail(handle: object) -> None:
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError):
        write_file_atomically(target, fail)
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []


KILLED_SAVE = """
import sys, time
from pathlib import Path
from converters.files import write_file_atomically
def slow(handle):
    handle.write(b"x" * 1000)
    handle.flush()
    print("writing", flush=True)
    time.sleep(60)
write_file_atomically(Path(sys.argv[1]), slow)
"""


def test_temporary_of_a_killed_save_is_removed_by_the_next_save(tmp_path: Path) -> None:
    target = tmp_path / "model.ptrt"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVE, str(target)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stale = leftovers(tmp_path)
    assert len(stale) == 1
    old = time.time() - 10
    os.utime(tmp_path / stale[0], (old, old))
    write_file_atomically(target, b"new")
    assert target.read_bytes() == b"new" and leftovers(tmp_path) == []


def test_temporary_of_a_save_in_progress_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "model.ptrt"
    started, release = threading.Event(), threading.Event()

    def slow(handle: object) -> None:
        started.set()
        release.wait(30)

    writer = threading.Thread(target=write_file_atomically, args=(target, slow))
    writer.start()
    assert started.wait(30)
    busy = leftovers(tmp_path)
    old = time.time() - 10
    os.utime(tmp_path / busy[0], (old, old))
    write_file_atomically(target, b"other")  # a second save of the same path meanwhile
    assert leftovers(tmp_path) == busy
    release.set()
    writer.join()
    assert leftovers(tmp_path) == [] and target.exists()
