"""Write a chat's history without the engine: for when the engine process died.

The UI process (which never imports MLX) knows the history it showed, the
reply streamed so far included; the store (or the session file) holds the chat
as of its last save. ``save_history`` makes the saved history the UI's and keeps
the saved caches as they are: they still hold the tokens the header lists, and
the next turn reuses them up to where the conversation differs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from sessions.file_append import rewrite_header
from sessions.file_format import encode_header, read_header
from sessions.store_db import SUFFIX, database_path
from sessions.store_index import StoreIndex


def save_history(path: Path, history: Sequence[tuple[str, str]]) -> bool:
    """Make the chat at ``path`` hold ``history`` ((role, content) after the system prompt).

    ``path`` is a session file, or a store chat's address (``SessionStore.path_for``).
    Returns False when it already does (nothing written). Raises SessionFileError
    when the chat cannot be read or written; it is then as it was.
    """
    path = Path(path)
    wanted = [(role, content) for role, content in history]
    if path.name.endswith(SUFFIX) and database_path(path.parent).is_file():
        index = StoreIndex(path.parent)
        try:
            changed = index.set_history(path.name[: -len(SUFFIX)], wanted, time.time())
        finally:
            index.close()
        if changed is not None:  # else an earlier version's file in the store folder
            return changed
    return _save_in_file(path, wanted)


def _save_in_file(path: Path, history: list[tuple[str, str]]) -> bool:
    header = read_header(path)
    wanted = [{"role": role, "content": content} for role, content in history]
    if header.get("history") == wanted:
        return False
    header["history"] = wanted
    header["updated"] = time.time()
    rewrite_header(path, encode_header(header))
    return True
