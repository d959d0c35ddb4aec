"""The engine host's autosave: after every change of the chat, and never at the cost of the chat itself.

A save that fails (disk full, read-only folder, file too large) leaves the
previous file as it was (writes are atomic) and the chat in memory and on
screen; the UI is told what failed and what to do, and the next reply tries again.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

from app.engine_host import protocol as p
from app.engine_host.failure_text import failure_title, with_hint
from app.engine_host.open_chat import OpenChat
from mlxcore import MlxchatError


class Autosave:
    """Mixed into EngineServer; uses its chat (the one on screen), store, send and _on_listsessions.

    Every method takes the chat it is about (an ``OpenChat``): the one on screen unless said.
    """

    chat: OpenChat | None
    store: Any

    def __init__(self) -> None:
        self.saving = threading.Lock()  # held while a file is written (the parent-process watch waits for it)

    def _autosave(self, force: bool = False, chat: OpenChat | None = None) -> bool:
        """Save the chat (once it has a user message, or when ``force``); False when the save failed."""
        chat = chat or self.chat
        session = chat.session if chat is not None else None
        if session is None or not (force or any(m.role == "user" for m in session.messages)):
            return True
        try:
            with self.saving:
                if chat.file is not None:
                    session.save(chat.file)
                else:
                    chat.session_id = self.store.save(session, chat.session_id).id
        except Exception as error:  # noqa: BLE001  a failed save must not cost the reply its Done and update
            self._save_failed(chat, error)
            return False
        if chat.save_error is not None:
            self.send(p.Notice(f"Saved again: {self._where(chat)}"))
        chat.save_error = None
        if chat.file is None:
            self._on_listsessions(p.ListSessions())
        return True

    def _save_failed(self, chat: OpenChat, error: Exception) -> None:
        first = chat.save_error is None
        if isinstance(error, MlxchatError):
            chat.save_error, title = str(error), failure_title(error)
        else:  # a bug: say so with the trace, the chat stays
            chat.save_error = f"{type(error).__name__}: {error}"
            title = "Chat not saved"
            error = MlxchatError(chat.save_error + "\n\n" + traceback.format_exc(limit=4))
        if chat is not self.chat:  # a chat answering in the background: it stays open here until saved
            self.send(p.Notice(f"“{chat.title}” was not saved ({chat.save_error}). It stays open in this window: "
                               "open it and press ctrl+s.", "error"))
        elif first:  # one dialog; while the trouble lasts, each later try is a notice
            self.send(p.Failure(title, with_hint(error, fatal=False)))
        else:
            self.send(p.Notice(f"The chat is still not saved: {chat.save_error}", "error"))

    def _has_file(self, chat: OpenChat | None = None) -> bool:
        chat = chat or self.chat
        if chat.file is not None:
            return chat.file.exists()
        return chat.session_id is not None

    def _file(self, chat: OpenChat | None = None) -> str | None:
        """The file autosave writes, once it exists."""
        chat = chat or self.chat
        if not self._has_file(chat):
            return None
        return str(chat.file or self.store.path_for(chat.session_id))

    def _where(self, chat: OpenChat | None = None) -> str:
        chat = chat or self.chat
        return str(chat.file) if chat.file else f"session {chat.session_id}"
