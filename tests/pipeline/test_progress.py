"""Progress bars on a terminal only: the precision search's tries ("try i of N") and the per-layer chunks draw a
bar when stderr is a TTY (a pseudo-terminal here) and write nothing when it is a pipe, as in CI logs."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

import pytest

from pipeline.precision.search import most_tries, shortest_passing_prefix
from pipeline.progress import on_terminal, progress, track

ROOT = Path(__file__).resolve().parents[2]

SEARCH = textwrap.dedent(
    """
    import time
    from pipeline.precision.search import shortest_passing_prefix
    def passes(k):
        time.sleep(0.15)  # a candidate build: long enough for the bar to redraw
        return k >= 23
    print("head", shortest_passing_prefix(100, passes, "precision search (fp16)"))
    """
)
LAYERS = textwrap.dedent(
    """
    import torch
    import pipeline
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)]).eval()
    report = pipeline.compare(model, torch.randn(2, 8), per_layer=True, memory_budget=200)
    print("chunks", report.layers.chunks)
    """
)


def run_on_terminal(source: str) -> tuple[str, str]:
    """Run ``source`` in a fresh interpreter whose stderr is a pseudo-terminal; (stdout, what the terminal got)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # a new pty is 0 columns wide
    process = subprocess.Popen(
        [sys.executable, "-c", source], cwd=ROOT, stdout=subprocess.PIPE, stderr=follower, text=True
    )
    os.close(follower)
    received = b""
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not data:
            break
        received += data
    stdout, _ = process.communicate(timeout=600)
    os.close(leader)
    assert process.returncode == 0, received.decode(errors="replace")
    return stdout, received.decode(errors="replace")


def run_in_pipe(source: str) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([sys.executable, "-c", source], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return run


def test_search_shows_try_i_of_n_on_a_terminal_only() -> None:
    stdout, terminal = run_on_terminal(SEARCH)
    assert "head 23" in stdout
    total = most_tries(100)
    assert total == 8
    assert "precision search (fp16)" in terminal
    assert f"try 1 of {total}: 100 of 100 nodes in float32" in terminal and f"try 4 of {total}" in terminal
    assert "\r" in terminal  # a bar redrawn in place
    piped = run_in_pipe(SEARCH)
    assert "head 23" in piped.stdout and piped.stderr == ""  # a CI log: no bar, no line


def test_per_layer_chunks_show_a_bar_on_a_terminal_only() -> None:
    stdout, terminal = run_on_terminal(LAYERS)
    chunks = int(stdout.split("chunks")[1])
    assert chunks > 1  # the budget forces several chunks
    assert "per-layer comparison" in terminal and f"/{chunks}" in terminal
    piped = run_in_pipe(LAYERS)
    assert "per-layer comparison" not in piped.stderr and "\r" not in piped.stderr


@pytest.mark.parametrize("count", [1, 2, 3, 7, 8, 9, 100, 1000])
def test_the_tries_never_exceed_the_announced_total(count: int) -> None:
    for needed in range(1, count + 1, max(1, count // 13)):
        calls: list[int] = []

        def passes(k: int, needed: int = needed, calls: list[int] = calls) -> bool:
            calls.append(k)
            return k >= needed

        assert shortest_passing_prefix(count, passes) == needed
        assert len(calls) <= most_tries(count)


def test_off_a_terminal_nothing_is_drawn(capsys: pytest.CaptureFixture[str]) -> None:
    assert not on_terminal()  # pytest captures stderr
    with progress(3, "work") as bar:
        bar.update()
        bar.status("step 2")
        assert not bar.drawn
    assert list(track(range(4), 4, "items")) == [0, 1, 2, 3]
    assert capsys.readouterr().err == ""
