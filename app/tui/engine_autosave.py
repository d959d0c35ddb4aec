"""The engine host's autosave: after every change of the chat, and never at the cost of the chat itself.

A save that fails (disk full, read-only folder, file too large) leaves the
previous file as it was (writes are atomic) and the chat in memory and on
screen; the UI is told what failed and what to do, and the next reply tries again.
"""

from __future__ import annotations

import threading
import traceback
from pathlib import Path
from typing import Any

from app.tui import protocol as p
from app.tui.failure_text import failure_title, with_hint
from mlxcore.errors import MlxchatError


class Autosave:
    """Mixed into EngineServer; uses its session, session_id, session_file, store, send and _on_listsessions."""

    session: Any
    session_id: str | None
    session_file: Path | None
    store: Any

    def __init__(self) -> None:
        self.save_error: str | None = None  # why the last save failed; None once a save succeeds
        self.saving = threading.Lock()  # held while a file is written (the parent-process watch waits for it)

    def _autosave(self, force: bool = False) -> bool:
        """Save the open chat (once it has a user message, or when ``force``); False when the save failed."""
        session = self.session
        if session is None or not (force or any(m.role == "user" for m in session.messages)):
            return True
        try:
            with self.saving:
                if self.session_file is not None:
                    session.save(self.session_file)
                else:
                    self.session_id = self.store.save(session, self.session_id).id
        except Exception as error:  # noqa: BLE001  a failed save must not cost the reply its Done and update
            self._save_failed(error)
            return False
        if self.save_error is not None:
            self.send(p.Notice(f"Saved again: {self._where()}"))
        self.save_error = None
        if self.session_file is None:
            self._on_listsessions(p.ListSessions())
        return True

    def _save_failed(self, error: Exception) -> None:
        first = self.save_error is None
        if isinstance(error, MlxchatError):
            self.save_error, title = str(error), failure_title(error)
        else:  # a bug: say so with the trace, the chat stays
            self.save_error = f"{type(error).__name__}: {error}"
            title = "Chat not saved"
            error = MlxchatError(self.save_error + "\n\n" + traceback.format_exc(limit=4))
        if first:  # one dialog; while the trouble lasts, each later try is a notice
            self.send(p.Failure(title, with_hint(error, fatal=False)))
        else:
            self.send(p.Notice(f"The chat is still not saved: {self.save_error}", "error"))

    def _has_file(self) -> bool:
        if self.session_file is not None:
            return self.session_file.exists()
        return self.session_id is not None

    def _file(self) -> str | None:
        """The file autosave writes, once it exists."""
        if not self._has_file():
            return None
        return str(self.session_file or self.store.path_for(self.session_id))

    def _where(self) -> str:
        return str(self.session_file) if self.session_file else f"session {self.session_id}"
