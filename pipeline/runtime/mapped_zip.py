"""The members of an artifact (a zip of stored members) as views of the memory-mapped file, and the writing side
that places a member's data at an aligned offset so a runtime can map it in place.

Reading a 226 MB artifact through ``zipfile`` copies every member (and checks its CRC) before anything else can
start; mapping the file and slicing it costs nothing, and the SHA-256 of the manifest (which supersedes the CRC)
runs over the same pages in a thread while ONNX Runtime makes its session. A member wanted as a plain file later
(:class:`MemberCopy`) is copied out of the artifact's link, and checked again, when it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from converters.errors import ArtifactError

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's structFileHeader: 30 bytes
_LOCAL_SIGNATURE = b"PK\x03\x04"
_ZIP64_EXTRA_BYTES = 20  # what zipfile adds to a local header written with force_zip64
_PADDING_ID = 0xD935  # the extra-field id Android's zipalign uses for padding
_CHUNK = 16 << 20


def aligned_member(name: str, offset: int, alignment: int) -> zipfile.ZipInfo:
    """A stored ``ZipInfo`` whose data, when its local header is written at ``offset`` with ``force_zip64``, starts
    at a multiple of ``alignment`` (the gap is an extra field that readers skip)."""
    info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
    info.compress_type = zipfile.ZIP_STORED
    header = _LOCAL_HEADER.size + len(name.encode()) + _ZIP64_EXTRA_BYTES + 4  # 4: the padding field's own header
    gap = -(offset + header) % alignment
    info.extra = struct.pack("<HH", _PADDING_ID, gap) + b"\0" * gap
    return info


class MappedZip:
    """A zip file mapped read-only; :meth:`view` gives a stored member's bytes without copying them.

    ``stat`` is the mapped file's identity (device, inode), so whoever opens the path again can check it is the same
    file. Raises ``zipfile.BadZipFile`` / ``OSError`` / ``ValueError`` for what is not a readable zip.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO = open(path, "rb")  # noqa: SIM115 - held for the mapping's lifetime; closed by close()
        try:
            self.stat = os.fstat(self._file.fileno())
            if self.stat.st_size == 0:
                raise zipfile.BadZipFile("the file is empty")
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            self._file.close()
            raise
        try:
            self.archive = zipfile.ZipFile(self._file)
        except BaseException:
            self._map.close()
            self._file.close()
            raise
        self._views: list[memoryview] = []
        self._offsets: dict[int, int] = {}

    def names(self) -> list[str]:
        """The members' names."""
        return self.archive.namelist()

    def data_offset(self, name: str) -> int:
        """Where the stored member's bytes start in the file: after its local header, name and extra field (the
        central directory's copy of the extra field may differ, so the local header is read)."""
        info = self.archive.getinfo(name)
        if info.compress_type != zipfile.ZIP_STORED:
            raise zipfile.BadZipFile(f"member {name} is compressed; artifacts store their members uncompressed")
        start = info.header_offset
        header = self._map[start : start + _LOCAL_HEADER.size]
        if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
            raise zipfile.BadZipFile(f"member {name} has no local header where the directory says")
        fields = _LOCAL_HEADER.unpack(header)
        offset = start + _LOCAL_HEADER.size + fields[-2] + fields[-1]  # name length, extra length
        if offset + info.file_size > len(self._map):
            raise zipfile.BadZipFile(f"member {name} runs past the end of the file (truncated?)")
        return offset

    def fileno(self) -> int:
        """The mapped file's descriptor."""
        return self._file.fileno()

    def offset_of(self, view: memoryview) -> int:
        """Where a view given by :meth:`view` starts in the file."""
        return self._offsets[id(view)]

    def view(self, name: str) -> memoryview:
        """The stored member's bytes, a view of the mapping (valid until :meth:`close`)."""
        offset = self.data_offset(name)
        view = memoryview(self._map)[offset : offset + self.archive.getinfo(name).file_size]
        self._views.append(view)
        self._offsets[id(view)] = offset
        return view

    def close(self) -> None:
        """Release the views, the mapping and the file."""
        for view in self._views:
            view.release()
        self._views.clear()
        self._offsets.clear()
        self.archive.close()
        with contextlib.suppress(BufferError):  # a view someone still holds: the mapping goes when it does
            self._map.close()
        self._file.close()


class DigestThread:
    """The SHA-256 of a view, computed in a thread (hashlib and file writes let go of the GIL), the view copied to
    ``copy_to`` on the way when given, then ``done`` closed; ``expected`` is the digest it should have."""

    def __init__(
        self, view: memoryview, expected: str, done: MappedZip | None = None, copy_to: Path | None = None
    ) -> None:
        self._view, self._done, self._copy_to, self.expected = view, done, copy_to, expected
        self._digest: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="artifact-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._digest = hashlib.sha256(self._view).hexdigest()
            if self._copy_to is not None:
                self._copy(self._copy_to)
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread, which raises it
            self._error = exc
        finally:
            self._view = memoryview(b"")
            if self._done is not None:
                self._done.close()

    def _copy(self, target: Path) -> None:
        """Copy the view to ``target``: in the kernel (``copy_file_range``, 0.1 s for 226 MB on ext4) from the mapped
        file, where the platform has it; else from the view, in chunks (0.4 s)."""
        with open(target, "wb") as out:
            if self._done is not None and hasattr(os, "copy_file_range"):
                source, offset, left = self._done.fileno(), self._done.offset_of(self._view), len(self._view)
                with contextlib.suppress(OSError):  # a file system without it: the chunks below write what is left
                    while left > 0 and (count := os.copy_file_range(source, out.fileno(), left, offset)) > 0:
                        offset, left = offset + count, left - count
                start = len(self._view) - left
            else:
                start = 0
            for begin in range(start, len(self._view), _CHUNK):
                chunk = self._view[begin : begin + _CHUNK]
                out.write(chunk)
                chunk.release()

    def result(self) -> str:
        """Wait for the digest (and the copy); the thread's error is raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._digest is not None
        return self._digest


@dataclass(frozen=True)
class MemberCopy:
    """Writes a stored member (``size`` bytes at ``offset`` of the file at ``link``: a loaded artifact's hard link),
    checked against its SHA-256 on the way (the file may have been written over in place since it was loaded), to the
    path it is given; an ArtifactError, and nothing written, when the bytes are not the ones expected."""

    artifact: Path  # its path when loaded, for messages
    link: Path
    offset: int
    size: int
    expected: str

    def __call__(self, target: Path) -> None:
        digest = hashlib.sha256()
        partial = target.with_name(target.name + ".partial")
        try:
            with open(self.link, "rb") as source, open(partial, "wb") as out:
                source.seek(self.offset)
                left = self.size
                while left > 0 and (chunk := source.read(min(left, _CHUNK))):
                    digest.update(chunk)
                    out.write(chunk)
                    left -= len(chunk)
            if left or digest.hexdigest() != self.expected:
                raise ArtifactError(
                    f"{self.artifact}: its weights changed since it was loaded (the file was written over in place)",
                    fix="load it again",
                )
            os.replace(partial, target)
        except OSError as exc:
            raise ArtifactError(f"{self.artifact}: copying its weights failed: {exc}", fix="load it again") from exc
        finally:
            partial.unlink(missing_ok=True)
