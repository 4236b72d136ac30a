"""The engine cache's size bound (``trt_engine_cache_size``) with real files and a real lock held by another
process: least recently used eviction, a hit as a use, the new entry kept, busy entries skipped, no bound.

The cache stores bytes, so the "engines" here are arbitrary bytes; nothing is mocked.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from engine_cache_support import ENGINE, ENTRY, LOGGER, age, store

from converters.errors import InputError
from converters.settings import Settings
from pipeline.backends.tensorrt.engine_cache import EngineCache


def kept(directory: Path) -> set[str]:
    """The keys whose engine and digest are both in the directory."""
    return {p.stem for p in directory.glob("*.plan") if p.with_name(p.name + ".sha256").exists()}


def test_the_least_recently_used_entry_goes_and_a_hit_counts_as_a_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EngineCache(tmp_path, max_bytes=3 * ENTRY)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for key, seconds_ago in (("a", 300), ("b", 200), ("c", 100)):
            store(cache, key)
            age(cache, key, seconds_ago)
    assert not [r for r in caplog.records if "evict" in r.getMessage()], "nothing to evict: nothing said"
    assert store(cache, "a") == "hit"  # a is now the most recently used; b the least
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert store(cache, "d") == "built"
    assert kept(tmp_path) == {"a", "c", "d"}
    assert not (tmp_path / "b.plan").exists() and not (tmp_path / "b.plan.sha256").exists()
    evicted = [r for r in caplog.records if "evicted" in r.getMessage()]
    assert len(evicted) == 1 and evicted[0].levelno == logging.INFO
    assert f"evicted 1 least recently used engine(s), {ENTRY} bytes" in evicted[0].getMessage()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert store(cache, "b") == "built"  # a miss, not a corrupted entry
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert kept(tmp_path) == {"a", "d", "b"}  # c was the least recently used now


def test_the_new_entry_is_kept_when_it_alone_is_over_the_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EngineCache(tmp_path, max_bytes=2 * ENTRY)
    store(cache, "old")
    age(cache, "old", 100)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert store(cache, "big", 5 * ENGINE) == "built"
    assert kept(tmp_path) == {"big"}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert f"({5 * ENGINE + 64} bytes" in warned[0] and f"trt_engine_cache_size={2 * ENTRY} bytes" in warned[0]
    assert f"Set trt_engine_cache_size to at least {5 * ENGINE + 64}" in warned[0]
    assert store(cache, "big", 5 * ENGINE) == "hit"


HOLD_LOCK = """
import fcntl, sys
handle = open(sys.argv[1], "a+b")
fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture
def lock_held_elsewhere() -> Iterator[Callable[[Path], None]]:
    """Call it with a lock file path: another process takes that lock and holds it until the test ends."""
    holders: list[subprocess.Popen[str]] = []

    def hold(path: Path) -> None:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        holders.append(holder)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"

    yield hold
    for holder in holders:
        holder.communicate(timeout=30)


def test_an_entry_locked_by_another_process_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, lock_held_elsewhere: Callable[[Path], None]
) -> None:
    cache = EngineCache(tmp_path, max_bytes=2 * ENTRY)
    for key, seconds_ago in (("busy", 300), ("idle", 200)):
        store(cache, key)
        age(cache, key, seconds_ago)
    lock_held_elsewhere(tmp_path / "busy.plan.lock")
    store(cache, "new")
    assert kept(tmp_path) == {"busy", "new"}  # the least recently used was busy: the next one went

    tight = EngineCache(tmp_path, max_bytes=ENTRY)
    age(cache, "new", 100)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        store(tight, "newer")
    assert kept(tmp_path) == {"busy", "newer"}  # over the bound while busy is held, and said so
    assert any("in use by another process" in r.getMessage() for r in caplog.records)


def test_an_engine_removed_before_its_digest_is_a_miss_not_a_corrupted_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EngineCache(tmp_path)
    store(cache, "k")
    cache.entry_path("k").unlink()  # what a process killed between eviction's two removals leaves
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store(cache, "k") == "built"
    # no "corrupted entry" warning (the level filter of at_level is not what decides: another test's handler may
    # pass the INFO "stored" line through, as a full CI run showed)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert kept(tmp_path) == {"k"} and store(cache, "k") == "hit"


@pytest.mark.parametrize("bound", [None, 0])
def test_none_or_zero_is_no_bound(tmp_path: Path, bound: int | None) -> None:
    settings = Settings(cache_dir=str(tmp_path), trt_engine_cache_size=bound)
    cache = EngineCache(settings.cache_dir, settings.trt_engine_cache_size)
    for i in range(5):
        store(cache, f"k{i}", 10 * ENGINE)
        age(cache, f"k{i}", 100 - i)
    assert cache.evict() == 0
    assert kept(tmp_path) == {f"k{i}" for i in range(5)}
    assert EngineCache(tmp_path, 2 * 10 * ENGINE + 200).evict() == 3 * (10 * ENGINE + 64)  # the same, bounded
    assert kept(tmp_path) == {"k3", "k4"}


def test_the_default_bound_is_torch_tensorrts_and_bad_values_are_settings_errors() -> None:
    assert Settings().trt_engine_cache_size == 5 << 30
    with pytest.raises(InputError, match=r"(?s)trt_engine_cache_size must be a number of bytes >= 0, got -1.*fix:"):
        Settings(trt_engine_cache_size=-1)
    for bad in ("5GB", 5.0, True):
        wrong_type = r"(?s)setting trt_engine_cache_size must be None or int, got .*fix: pass trt_engine_cache_size="
        with pytest.raises(InputError, match=wrong_type):
            Settings(trt_engine_cache_size=bad)  # type: ignore[arg-type]
