"""What the engine cache tells its user, pinned word for word (``pipeline.backends.tensorrt.engine_cache``): the log
lines of a hit, a store and a corrupted entry, the status of a rebuild, the eviction's report and its sizes, the
warnings of an entry that cannot be removed and of a platform without ``fcntl``, and the edges of the eviction that
only those lines show (how busy and removed entries are counted, an entry dated in the future, an engine file
without its digest, a dangling ``*.plan`` link). Written against the mutation run of docs/mutation.md.

The cache stores bytes, so the "engines" here are arbitrary bytes; the gigabyte entries are sparse files (their
size is what the cache reads). Another process's lock is an ``exclusive_lock`` held in this one: ``flock`` locks
belong to the open file, so the cache's own attempt fails as it does against another process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_cache_support import ENGINE, ENTRY, LOGGER, age, external_model, store

from converters.errors import BuildError
from pipeline.backends.tensorrt.engine_cache import EngineCache, exclusive_lock, graph_digest


def kept(directory: Path) -> set[str]:
    """The keys whose engine file is in the directory."""
    return {p.stem for p in directory.glob("*.plan") if p.exists()}


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """(level, message) of every line the cache logged."""
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]


@contextlib.contextmanager
def held(cache: EngineCache, *keys: str) -> Iterator[None]:
    """The entries' locks held, as by a process building or reading them."""
    with contextlib.ExitStack() as stack:
        for key in keys:
            plan = cache.entry_path(key)
            stack.enter_context(exclusive_lock(plan.with_name(plan.name + ".lock")))
        yield


def sparse_entry(cache: EngineCache, key: str, size: int, seconds_ago: float) -> None:
    """An entry of ``size`` bytes (engine and digest) that takes no disk space."""
    plan = cache.entry_path(key)
    with plan.open("wb") as handle:
        handle.truncate(size - 64)
    plan.with_name(plan.name + ".sha256").write_text("0" * 64)
    age(cache, key, seconds_ago)


# -- get_or_build --------------------------------------------------------------------------------------------------


def test_a_store_and_a_hit_say_so_and_the_hit_names_the_entry(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = EngineCache(tmp_path)
    path = cache.entry_path("k")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        built = cache.get_or_build("k", lambda: b"e" * 123)
        hit = cache.get_or_build("k", lambda: b"never built")
    assert said(caplog) == [("INFO", f"engine cache: stored {path} (123 bytes)"), ("INFO", f"engine cache hit: {path}")]
    assert (built.status, built.path) == ("built", path)
    assert (hit.status, hit.path, hit.engine) == ("hit", path, b"e" * 123)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda plan: plan.with_name(plan.name + ".sha256").unlink(), "its SHA-256 file is missing"),
        (lambda plan: plan.write_bytes(b"other bytes"), "the engine bytes do not match the recorded SHA-256"),
        # a digest file that is not text (a disk error): read with replacement characters, a mismatch, not a crash
        (
            lambda plan: plan.with_name(plan.name + ".sha256").write_bytes(b"\xff\xfe\x80" * 20),
            "the engine bytes do not match the recorded SHA-256",
        ),
    ],
    ids=["no-digest", "other-bytes", "binary-digest"],
)
def test_a_corrupted_entry_is_said_in_full_and_its_rebuild_names_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, why: str
) -> None:
    cache = EngineCache(tmp_path)
    path = cache.get_or_build("k", lambda: b"first engine").path
    damage(path)  # type: ignore[operator]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        again = cache.get_or_build("k", lambda: b"second engine")
    assert again.status == f"rebuilt (the cached entry was corrupted: {why})"
    assert said(caplog) == [
        ("WARNING", f"engine cache entry {path} is corrupted ({why}); removing it and building again"),
        ("INFO", f"engine cache: stored {path} (13 bytes)"),
    ]
    assert cache.get_or_build("k", lambda: b"third").engine == b"second engine"


def test_a_hit_on_an_engine_file_that_cannot_be_touched_is_still_a_hit(tmp_path: Path) -> None:
    """A hit marks the entry used (its modification time); an engine file the process may read but not touch (a
    shared cache, an immutable file) is still served. Needs ``chattr +i`` (root on ext4 and the like)."""
    cache = EngineCache(tmp_path)
    path = cache.get_or_build("k", lambda: b"engine").path
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("no chattr +i here: the engine file cannot be made untouchable")
    try:
        with pytest.raises(PermissionError):
            os.utime(path)
        assert cache.get_or_build("k", lambda: b"never built").status == "hit"
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


# -- the eviction's report -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "shown"),
    [(3 << 20, "3.0 MiB"), ((1 << 30) - (1 << 20), "1023.0 MiB"), (1 << 30, "1.00 GiB"), (5 << 29, "2.50 GiB")],
)
def test_the_eviction_reports_what_it_removed_in_bytes_and_in_mib_or_gib(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, size: int, shown: str
) -> None:
    cache = EngineCache(tmp_path, max_bytes=1 << 20)
    sparse_entry(cache, "huge", size, 100)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        store(cache, "new")
    assert said(caplog)[1:] == [
        (
            "INFO",
            f"engine cache: evicted 1 least recently used engine(s), {size} bytes ({shown}), to keep {tmp_path} "
            f"within {1 << 20} bytes",
        )
    ]
    assert kept(tmp_path) == {"new"}


def test_an_entry_over_the_bound_alone_is_kept_and_the_warning_gives_both_sizes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EngineCache(tmp_path, max_bytes=1 << 30)
    sparse_entry(cache, "huge", 2 << 30, 0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert cache.evict(keep=cache.entry_path("huge")) == 0
    assert said(caplog) == [
        (
            "WARNING",
            f"engine cache: the engine just stored ({2 << 30} bytes, 2.00 GiB) is larger than the bound "
            f"trt_engine_cache_size={1 << 30} bytes (1.00 GiB), so the cache is bounded by less than one engine; it "
            f"is kept. Set trt_engine_cache_size to at least {2 << 30} (or None for no bound)",
        )
    ]
    assert kept(tmp_path) == {"huge"}


def test_entries_in_use_are_counted_and_said_with_what_the_cache_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EngineCache(tmp_path, max_bytes=2 * ENTRY)
    for key, seconds_ago in (("busy1", 400), ("busy2", 300), ("idle", 200)):
        store(EngineCache(tmp_path), key)  # stored without a bound: all three are there
        age(cache, key, seconds_ago)
    with held(cache, "busy1", "busy2"), caplog.at_level(logging.INFO, logger=LOGGER):
        store(cache, "new")
    assert said(caplog)[1:] == [
        (
            "INFO",
            f"engine cache: evicted 1 least recently used engine(s), {ENTRY} bytes (0.0 MiB), to keep {tmp_path} "
            f"within {2 * ENTRY} bytes",
        ),
        (
            "INFO",
            f"engine cache: {tmp_path} holds {3 * ENTRY} bytes, over its bound of {2 * ENTRY}, because 2 entry(ies) "
            "are in use by another process; they are removed by a later store",
        ),
    ]
    assert kept(tmp_path) == {"busy1", "busy2", "new"}


def test_a_busy_entry_with_the_rest_exactly_at_the_bound_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EngineCache(tmp_path, max_bytes=2 * ENTRY)
    for key, seconds_ago in (("busy", 300), ("idle", 200)):
        store(cache, key)
        age(cache, key, seconds_ago)
    with held(cache, "busy"), caplog.at_level(logging.INFO, logger=LOGGER):
        store(cache, "new")
    assert [message for _, message in said(caplog)][1:] == [
        f"engine cache: evicted 1 least recently used engine(s), {ENTRY} bytes (0.0 MiB), to keep {tmp_path} "
        f"within {2 * ENTRY} bytes"
    ]
    assert kept(tmp_path) == {"busy", "new"}


def test_an_eviction_without_a_kept_entry_reports_the_busy_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EngineCache(tmp_path, max_bytes=100)
    for key, seconds_ago in (("busy", 300), ("idle", 200)):
        EngineCache(tmp_path).get_or_build(key, lambda: b"x" * ENGINE)
        age(cache, key, seconds_ago)
    with held(cache, "busy"), caplog.at_level(logging.INFO, logger=LOGGER):
        assert cache.evict() == ENTRY
    assert said(caplog)[-1] == (
        "INFO",
        f"engine cache: {tmp_path} holds {ENTRY} bytes, over its bound of 100, because 1 entry(ies) are in use by "
        "another process; they are removed by a later store",
    )
    assert kept(tmp_path) == {"busy"}


def test_an_entry_that_cannot_be_removed_is_warned_about_and_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EngineCache(tmp_path, max_bytes=ENTRY)
    store(cache, "odd")
    age(cache, "odd", 300)
    lock = tmp_path / "odd.plan.lock"
    lock.unlink()
    lock.mkdir()  # its lock cannot be opened: the removal fails with an OSError
    with caplog.at_level(logging.INFO, logger=LOGGER):
        store(cache, "new")
    assert said(caplog)[1:] == [
        (
            "WARNING",
            f"engine cache: could not remove {cache.entry_path('odd')} ([Errno 21] Is a directory: '{lock}'); the "
            "cache may stay over its bound",
        ),
        (
            "INFO",
            f"engine cache: {tmp_path} holds {2 * ENTRY} bytes, over its bound of {ENTRY}, because 1 entry(ies) are "
            "in use by another process; they are removed by a later store",
        ),
    ]
    assert kept(tmp_path) == {"odd", "new"}


def test_without_fcntl_the_bound_is_not_enforced_and_the_warning_says_what_to_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("a", "b", "c"):
        store(EngineCache(tmp_path), key)
    monkeypatch.setitem(sys.modules, "fcntl", None)  # as on Windows
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert EngineCache(tmp_path, max_bytes=ENTRY).evict() == 0
    assert said(caplog) == [
        (
            "WARNING",
            "engine cache: trt_engine_cache_size is not enforced on this platform (no fcntl to skip entries another "
            f"process holds); remove old *.plan files from {tmp_path} by hand, or pass trt_engine_cache_size=None",
        )
    ]
    assert kept(tmp_path) == {"a", "b", "c"}


# -- the eviction's edges ------------------------------------------------------------------------------------------


def test_entries_dated_after_the_new_one_are_still_evicted(tmp_path: Path) -> None:
    """An entry whose time is in the future (another machine's clock on a shared cache) sorts after the one just
    stored: the eviction skips the new entry and goes on."""
    cache = EngineCache(tmp_path, max_bytes=ENTRY)
    store(EngineCache(tmp_path), "old")
    age(cache, "old", 100)
    store(EngineCache(tmp_path), "future")
    age(cache, "future", -1000)
    store(cache, "new")
    assert kept(tmp_path) == {"new"}


def test_an_engine_without_its_digest_is_evicted_and_counted_by_its_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash between an entry's two writes leaves an engine without its digest: it is sized (0 for the missing
    file), evicted and counted, even at one byte."""
    cache = EngineCache(tmp_path, max_bytes=ENTRY)
    cache.entry_path("crashed").write_bytes(b"x")
    age(cache, "crashed", 100)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        store(cache, "new")
    assert said(caplog)[1:] == [
        (
            "INFO",
            f"engine cache: evicted 1 least recently used engine(s), 1 bytes (0.0 MiB), to keep {tmp_path} within "
            f"{ENTRY} bytes",
        )
    ]
    assert kept(tmp_path) == {"new"}


def test_an_empty_engine_file_is_cleared_but_not_counted_as_an_engine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EngineCache(tmp_path, max_bytes=ENTRY)
    cache.entry_path("empty").write_bytes(b"")
    age(cache, "empty", 300)
    store(cache, "idle")
    age(cache, "idle", 200)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        store(cache, "new")
    assert said(caplog)[1:] == [
        (
            "INFO",
            f"engine cache: evicted 1 least recently used engine(s), {ENTRY} bytes (0.0 MiB), to keep {tmp_path} "
            f"within {ENTRY} bytes",
        )
    ]
    assert kept(tmp_path) == {"new"}


def test_dangling_plan_links_are_not_entries_and_hide_none(tmp_path: Path) -> None:
    """``*.plan`` links to engines deleted elsewhere are passed over, wherever the directory lists them."""
    cache = EngineCache(tmp_path, max_bytes=2 * ENTRY)
    for i in range(6):
        (tmp_path / f"gone{i}.plan").symlink_to(tmp_path / "elsewhere" / f"gone{i}.plan")
        store(EngineCache(tmp_path), f"e{i}")
        age(cache, f"e{i}", 600 - 100 * i)
    store(cache, "new")
    assert kept(tmp_path) == {"e5", "new"}
    assert sorted(p.name for p in tmp_path.glob("gone*.plan")) == [f"gone{i}.plan" for i in range(6)]


def test_removing_one_entry_gives_the_bytes_freed_or_why_it_stays(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    store(cache, "k")
    plan = cache.entry_path("k")
    listed = plan.stat().st_mtime
    assert cache._remove_if_free(cache.entry_path("gone"), listed) == 0  # another process removed it first
    age(cache, "k", -50)
    assert cache._remove_if_free(plan, listed) is None and plan.exists()  # used since it was listed
    with held(cache, "k"):
        assert cache._remove_if_free(plan, plan.stat().st_mtime) is None and plan.exists()  # in use
    assert cache._remove_if_free(plan, plan.stat().st_mtime) == ENTRY and not plan.exists()


# -- graph_digest --------------------------------------------------------------------------------------------------


def test_unreadable_external_weights_are_an_error_that_names_the_file_and_the_fix(tmp_path: Path) -> None:
    outside = external_model(tmp_path)
    (tmp_path / "m.data").unlink()
    with pytest.raises(BuildError) as error:
        graph_digest(outside, tmp_path)
    missing = tmp_path / "m.data"
    assert str(error.value) == (
        f"[build] the graph's external weights file {missing} cannot be read: [Errno 2] No such file or directory: "
        f"'{missing}'\n  fix: keep the external data file beside the .onnx file it belongs to"
    )
