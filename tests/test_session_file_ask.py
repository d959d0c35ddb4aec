"""`mlxchat ask --session FILE` and the appending file, as users run it: real processes on one file."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from session_file_forms import appending
from sessions.errors import SessionInUseError
from sessions.file_format import read_header
from sessions.store_lock import SessionLock

ROOT = Path(__file__).resolve().parent.parent
PAIR = ["--model", "mini-target", "--draft", "mini-draft", "--max-tokens", "8", "--no-think"]
HANG_S = 120  # only a bound for a process that hangs


def ask(path: Path, text: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app.cli", "ask", "--session", str(path), *PAIR, text], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))


def finished(run: subprocess.Popen) -> tuple[int, str]:
    _, err = run.communicate(timeout=HANG_S)
    return run.returncode, err


def said_it_waits(run: subprocess.Popen) -> bool:
    """Read ``run``'s stderr until it says it waits for the other ask (True), or ends or hangs (False)."""
    seen = threading.Event()

    def read() -> None:
        for line in run.stderr:
            if "is in use by another `mlxchat ask`: waiting for it to finish" in line:
                seen.set()
                return
    threading.Thread(target=read, daemon=True).start()
    return seen.wait(HANG_S)


def users(path: Path) -> list[str]:
    return [m["content"] for m in read_header(path)["history"] if m["role"] == "user"]


@pytest.mark.slow
def test_two_asks_on_one_file_take_turns_and_each_turn_is_appended(tmp_path):
    path = tmp_path / "chat.mlxchat"
    assert finished(ask(path, "What is 12 + 7?"))[0] == 0
    first = path.read_bytes()
    holder = SessionLock.acquire(path, mark_open=True, holder="ask")  # as an ask in the middle of its turn
    waiting = ask(path, "And 3 + 4?")
    said = said_it_waits(waiting)  # the lock is let go only once the second ask says it waits, however slow
    holder.release()
    code, err = finished(waiting)
    assert said and code == 0, err
    assert path.read_bytes().startswith(first) and appending(path), "the turn was appended"
    both = [ask(path, "Name a colour."), ask(path, "Name a fruit.")]  # at once: one waits for the other
    assert [finished(run)[0] for run in both] == [0, 0]
    assert users(path)[:2] == ["What is 12 + 7?", "And 3 + 4?"]
    assert sorted(users(path)[2:]) == ["Name a colour.", "Name a fruit."], "both turns, one after the other"


def test_a_lock_held_by_an_ask_is_waited_for_and_one_held_by_a_window_is_not(tmp_path):
    path = tmp_path / "chat.mlxchat"
    with SessionLock.acquire(path, holder="window"):
        start = time.monotonic()
        with pytest.raises(SessionInUseError, match="open in another mlxchat window: close it there first"):
            SessionLock.acquire(path, holder="ask", wait_s=30)
        assert time.monotonic() - start < 1, "a window's hold is refused at once"
    told = []
    with SessionLock.acquire(path, holder="ask"):
        with pytest.raises(SessionInUseError, match="still in use by another `mlxchat ask` after 2 s"):
            SessionLock.acquire(path, holder="ask", wait_s=1.5, on_wait=lambda: told.append(time.monotonic()))
    assert len(told) == 1, "the wait was announced once"
    holder = SessionLock.acquire(path, holder="ask")
    threading.Timer(0.3, holder.release).start()
    SessionLock.acquire(path, holder="ask", wait_s=10).release()  # taken once the other lets go


@pytest.mark.slow
def test_the_write_ratio_bench_row():
    """The row as `mlxchat bench` runs it (real ask processes), on a shorter chat."""
    from bench.session_file_write import session_file_write_ratio
    row = session_file_write_ratio("mini-target", "mini-draft", 1, min_tokens=400, dead_space=False)
    assert row["tokens"] >= 400 and row["new_tokens"][0] > 0
    assert row["written_bytes"][0] < row["file_bytes"] / 2, "a turn's save is not a rewrite of the file"
    assert 0 < row["value"] <= 2
