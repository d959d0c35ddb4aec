"""The disk calls of an appending save (sessions/file_append.py), counted, and cut short where a test says.

``run_forked(action, kill_at)`` forks; the child patches file_append's ``os`` and ``open``
so that every write, fsync, truncate and rename is an event, runs ``action`` and, at event
``kill_at`` = (number, "before" | "half"), SIGKILLs itself before the call or after
writing half of its bytes. The child runs no MLX (the blocks are encoded before the fork):
only the file code, which is where a kill can leave something half written.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable

import sessions.file_append as file_append

WRITES = ("pwrite", "write")


class _Kill:
    def __init__(self, kill_at: tuple[int, str] | None) -> None:
        self.kill_at, self.events = kill_at, []

    def event(self, name: str, data: bytes | None = None) -> bytes | None:
        """Count one call; die here if it is the chosen one; what of ``data`` to write (half, before dying)."""
        self.events.append(name)
        if self.kill_at is None or len(self.events) != self.kill_at[0]:
            return data
        if self.kill_at[1] == "half" and data is not None and len(data) > 1:
            return data[: len(data) // 2]
        os.kill(os.getpid(), signal.SIGKILL)
        return data

    def after_half(self) -> None:
        if self.kill_at is not None and len(self.events) == self.kill_at[0]:
            os.kill(os.getpid(), signal.SIGKILL)


class _Os:
    """``os`` as file_append sees it: its disk calls counted."""

    def __init__(self, kill: _Kill) -> None:
        self._kill = kill

    def __getattr__(self, name: str):
        return getattr(os, name)

    def pwrite(self, fd: int, data, offset: int) -> int:
        part = self._kill.event("pwrite", bytes(data))
        done = os.pwrite(fd, part, offset)
        self._kill.after_half()
        return done

    def fsync(self, fd: int) -> None:
        self._kill.event("fsync")
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self._kill.event("ftruncate")
        os.ftruncate(fd, size)

    def replace(self, a, b) -> None:
        self._kill.event("replace")
        os.replace(a, b)


class _File:
    def __init__(self, f, kill: _Kill) -> None:
        self._f, self._kill = f, kill

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __getattr__(self, name: str):
        return getattr(self._f, name)

    def write(self, data: bytes) -> int:
        part = self._kill.event("write", data)
        self._f.write(part)
        if len(part) != len(data):
            self._f.flush()  # the half reaches the file before the kill
        self._kill.after_half()
        return len(data)


def run_forked(action: Callable[[], object], kill_at: tuple[int, str] | None = None,
               after_s: float | None = None) -> tuple[bool, list[str]]:
    """Run ``action`` in a forked child; (killed before it ended, the events it went through when not killed)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        kill = _Kill(kill_at)
        file_append.os = _Os(kill)
        file_append.sync_to_disk = file_append.os.fsync  # (F_FULLFSYNC on macOS: sessions/disk_sync.py)
        file_append.open = lambda *a, **k: _File(open(*a, **k), kill)
        try:
            action()
            os.write(write_end, ",".join(kill.events).encode())
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    os.close(write_end)
    if after_s is not None:
        time.sleep(after_s)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with os.fdopen(read_end, "rb") as pipe:
        events = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
        raise RuntimeError("the save failed in the forked child")
    return os.WIFSIGNALED(status), [e for e in events.split(",") if e]


def points(events: list[str]) -> list[tuple[int, str]]:
    """Every kill point of a save that went through ``events``: before each call, and half-way through writes."""
    out = []
    for number, name in enumerate(events, 1):
        out.append((number, "before"))
        if name in WRITES:
            out.append((number, "half"))
    return out
