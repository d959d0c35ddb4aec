"""Write a chat's history into its session file without the engine: for when the engine process died.

The UI process (which never imports MLX) knows the history it showed, the
reply streamed so far included; the file on disk holds the chat as of its last
save. ``save_history`` makes the file's history the UI's and keeps the saved
caches as they are: they still hold the tokens the header lists, and the next
turn reuses them up to where the conversation differs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from sessions.file_format import encode_header, read_header, rewrite_header


def save_history(path: Path, history: Sequence[tuple[str, str]]) -> bool:
    """Make the session file ``path`` hold ``history`` ((role, content) after the system prompt).

    Returns False when it already does (nothing written). Raises SessionFileError
    when the file cannot be read or written; the file is then as it was.
    """
    header = read_header(Path(path))
    wanted = [{"role": role, "content": content} for role, content in history]
    if header.get("history") == wanted:
        return False
    header["history"] = wanted
    header["updated"] = time.time()
    rewrite_header(Path(path), encode_header(header))
    return True
