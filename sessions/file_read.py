"""Read a session file of any layout: the whole files of formats 1 and 2, the appending one of format 3.

What comes back is raw and checksummed but not yet interpreted: the header dict, and the
cache data as format 1/2's safetensors payload or format 3's blocks. session_file.py
checks the header and builds tensors from either. Pure Python (no MLX).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sessions.errors import SessionFileError
from sessions.file_format import open_session_file, read_file, read_start
from sessions.file_header import APPENDING_VERSION, HYBRID_VERSION, VERSION
from sessions.file_layout import Commit, is_appending, read_blocks, read_commit

APPENDED = (APPENDING_VERSION, HYBRID_VERSION)  # the versions a file in the appending layout names


@dataclass(frozen=True)
class FileContents:
    """One session file as read: its header, and its caches' data in the form its layout keeps them."""

    header: dict[str, object]  # the JSON header as read: file_header.read_saved_session checks it
    payload: bytes | None  # formats 1 and 2: the safetensors bytes
    blocks: dict[str, list[bytes]] | None  # format 3: role -> its cache's block payloads in order
    commit: Commit | None  # format 3: the save it opened at
    stat: os.stat_result

    @property
    def torn(self) -> int:
        """Bytes of a save that did not finish, after the save it opened at (format 3)."""
        return self.commit.torn if self.commit is not None else 0


def read_contents(path: Path) -> FileContents:
    """Every byte of the file's current state read and checked against its checksums."""
    with open_session_file(path) as f:
        stat = os.fstat(f.fileno())
        if not is_appending(read_start(path, f, stat.st_size)):
            header, payload = read_file(path)
            _check_version(path, header, appending=False)
            return FileContents(header, payload, None, None, stat)
        commit = read_commit(path, f, stat.st_size)
        _check_version(path, commit.header, appending=True)
        return FileContents(commit.header, None, read_blocks(path, f, commit), commit, stat)


def _check_version(path: Path, header: dict[str, object], *, appending: bool) -> None:
    """Format 3 and 4 headers live in the appending layout only, and it holds no other (newer ones are refused
    as such by the header's own checks)."""
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION:
        return  # file_header.py says what is wrong with it
    if not appending and version in APPENDED:  # never written so: a newer writer's, or damage
        raise SessionFileError(f"{path} was saved by a newer mlxchat, or is damaged: it is a whole file with "
                               f"session format {version}, which this one only writes as appended saves.")
    if appending and version not in APPENDED:
        raise SessionFileError(f"{path} is inconsistent: its header says session format {version}, its layout "
                               "is format 3 or 4.")
