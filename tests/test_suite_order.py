"""The suite's own scheduling: the longest files start first (``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[1]


def test_the_files_started_first_exist() -> None:
    """A file renamed or removed would fall back to the collection's order without a word."""
    assert [path for path in LONGEST_FIRST if not (ROOT / path).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
