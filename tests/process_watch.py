"""Watching other processes from a test: is a pid gone, and read a child's marker lines without hanging."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from pathlib import Path

HANG_S = 120  # a bound for a process that hangs; every wait in these tests ends on an event before it


def is_gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie nobody reaped counts as gone). Every thread counts: a process's
    first thread turns zombie before the others have ended, and its files (and their locks) go with the last."""
    if Path("/proc/self").exists():
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except (FileNotFoundError, ProcessLookupError):
            return True
        return all(_task_gone(task) for task in tasks)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _task_gone(task: Path) -> bool:
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True  # the thread ended as we listed it


def seconds_until_gone(pid: int, limit: float) -> float | None:
    """How long ``pid`` took to exit, or None if it is still there after ``limit`` seconds."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if is_gone(pid):
            return time.monotonic() - start
        time.sleep(0.02)
    return None


class Lines:
    """A child's stdout as a queue of lines, read on a thread so that a wait can time out."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # the process closed its stdout

    def until(self, prefix: str) -> str:
        """The first line starting with ``prefix``; fails if the process ends or hangs first."""
        while True:
            line = self._lines.get(timeout=HANG_S)
            if line is None:
                raise AssertionError(f"the process ended (status {self.process.wait(HANG_S)}) before {prefix!r}; "
                                     f"it printed {self.seen}")
            self.seen.append(line)
            if line.startswith(prefix):
                return line
