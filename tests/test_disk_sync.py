"""Session files reach the drive itself: F_FULLFSYNC where the platform has it (macOS), fsync otherwise."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from sessions import disk_sync

F_FULLFSYNC = 51  # macOS's value


def test_a_mac_flushes_the_drives_cache_and_falls_back_where_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []

    def mac_fcntl(fd: int, command: int, *args: object) -> int:
        calls.append("F_FULLFSYNC" if command == F_FULLFSYNC else str(command))
        if refuse:
            raise OSError(45, "Operation not supported")  # SMB, some external drives
        return 0

    monkeypatch.setattr(fcntl, "F_FULLFSYNC", F_FULLFSYNC, raising=False)
    monkeypatch.setattr(fcntl, "fcntl", mac_fcntl)
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync"))
    with open(tmp_path / "f", "wb") as out:
        refuse = False
        disk_sync.sync_to_disk(out.fileno())
        assert calls == ["F_FULLFSYNC"]
        refuse = True
        disk_sync.sync_to_disk(out.fileno())
        assert calls == ["F_FULLFSYNC", "F_FULLFSYNC", "fsync"]


def test_every_commit_point_of_sessions_goes_through_it():
    """One helper: a plain os.fsync in sessions/ would skip the drive's cache on a Mac."""
    folder = Path(disk_sync.__file__).parent
    plain = [path.name for path in folder.glob("*.py") if path != Path(disk_sync.__file__)
             and "os.fsync(" in path.read_text()]
    assert plain == []
