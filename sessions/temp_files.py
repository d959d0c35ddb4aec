"""The temporary file of an atomic write, ``.NAME.PID.tmp`` beside the file it replaces, and the sweep of
those a killed writer left (kill -9 or a power cut skip its cleanup), which nothing else would remove."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

SESSION_SUFFIX = ".mlxchat"  # temporaries of files with this suffix are mlxchat's, whatever folder they are in
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)\.tmp")
QUIET_SECONDS = 60  # a dead writer's file untouched this long is left over (a live one on another host writes on)
STALE_SECONDS = 3600  # any writer's file untouched this long is left over: no save takes that long


def temp_path(path: Path) -> Path:
    """Where this process writes ``path`` before renaming it into place."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def sweep_dead_temps(folder: Path, also: str | None = None) -> int:
    """Delete the temporaries in ``folder`` of session files (or of the file named ``also``) that no write will
    finish: untouched for ``QUIET_SECONDS`` with their process gone from this machine, or for ``STALE_SECONDS``
    whatever the process (a folder shared with another machine); how many. Failures are ignored (a later
    sweep retries)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0  # a missing or unreadable folder: the write that follows says what is wrong
    removed = 0
    for entry in entries:
        match = TEMP_NAME.fullmatch(entry.name)
        if match is None or not (match["name"].endswith(SESSION_SUFFIX) or match["name"] == also):
            continue
        if entry.is_file(follow_symlinks=False) and _abandoned(entry, int(match["pid"])):
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


def _abandoned(entry: os.DirEntry, pid: int) -> bool:
    try:
        quiet = time.time() - entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return False
    return quiet > STALE_SECONDS or (quiet > QUIET_SECONDS and not _alive(pid))


def _alive(pid: int) -> bool:
    """Whether ``pid`` may still be writing: only "no such process" says it is not (a process of another
    user answers PermissionError; pid 0 or one too large is no writer of ours, so its file is left alone)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True
    return True
