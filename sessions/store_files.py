"""Chat files of earlier mlxchat versions in the store's folder: ``<id>.mlxchat``, one self-contained file each.

They are still listed, opened, renamed, exported and deleted as before; a save of one
writes it into the index and then removes its file (store.py). Pure helpers on paths.
"""

from __future__ import annotations

import re
from pathlib import Path

from sessions.file_append import rewrite_header
from sessions.file_format import encode_header, read_header
from sessions.file_header import SavedSession, read_saved_session
from sessions.store_db import SUFFIX

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def chat_files(root: Path) -> list[tuple[str, Path]]:
    """(id, file) of every chat file in ``root``."""
    return [(path.name[: -len(SUFFIX)], path) for path in Path(root).glob(f"*{SUFFIX}")
            if ID.fullmatch(path.name[: -len(SUFFIX)])]


def saved_in(path: Path) -> SavedSession:
    """The checked header of a chat file (``SessionFileError`` if it does not pass)."""
    return read_saved_session(read_header(path), str(path))


def retitle(path: Path, title: str) -> None:
    """Set a chat file's title (its header rewritten atomically; the payload checked as it is copied)."""
    header = read_header(path)
    read_saved_session(header, str(path))  # never rewrite a file that does not pass
    header["title"] = title
    rewrite_header(path, encode_header(header))


def copy_checked(source: Path, target: Path) -> None:
    """Copy a chat file to ``target`` atomically and compact, every checksum and header field checked first."""
    from sessions.session_file import export_compact  # MLX: only when a chat file is exported
    export_compact(source, Path(target))


def remove_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # the index is what counts: a file left behind is ignored while the index has the chat


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
