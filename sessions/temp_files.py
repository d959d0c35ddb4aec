"""The temporary file of an atomic write, ``.NAME.PID.tmp`` beside the file it replaces, and the sweep of
those a killed writer left (kill -9 or a power cut skip its cleanup), which nothing else would remove."""

from __future__ import annotations

import os
import re
from pathlib import Path

SESSION_SUFFIX = ".mlxchat"  # temporaries of files with this suffix are mlxchat's, whatever folder they are in
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)\.tmp")


def temp_path(path: Path) -> Path:
    """Where this process writes ``path`` before renaming it into place."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def sweep_dead_temps(folder: Path, also: str | None = None) -> int:
    """Delete the temporaries in ``folder`` of session files (or of the file named ``also``) whose writing
    process has exited; how many. A live writer's file is kept; failures are ignored (a later sweep retries)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0  # a missing or unreadable folder: the write that follows says what is wrong
    removed = 0
    for entry in entries:
        match = TEMP_NAME.fullmatch(entry.name)
        if match is None or not (match["name"].endswith(SESSION_SUFFIX) or match["name"] == also):
            continue
        if not _alive(int(match["pid"])) and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


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
