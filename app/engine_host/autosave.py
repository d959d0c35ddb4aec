"""The engine host's autosave: after every change of the chat, and never at the cost of the chat itself.

A save that fails (disk full, read-only folder, file too large) leaves the
previous file as it was (writes are atomic) and the chat in memory and on
screen; the UI is told what failed and what to do, and the next reply tries again.
"""

from __future__ import annotations

import threading
import traceback

from app.engine_host import protocol as p
from app.engine_host.channel import SendEvent
from app.engine_host.chats import Chats
from app.engine_host.failure_text import failure_title, with_hint
from app.engine_host.open_chat import OpenChat
from app.engine_host.store_holder import StoreHolder
from mlxcore import MlxchatError


class Autosave:
    """Saves a chat to its file, or to the store (which then lists it anew)."""

    def __init__(self, send: SendEvent, chats: Chats, store: StoreHolder) -> None:
        self.send, self.chats, self.store = send, chats, store
        self.saving = threading.Lock()  # held while a file is written (the parent-process watch waits for it)

    def save(self, chat: OpenChat, force: bool = False) -> bool:
        """Save ``chat`` (once it has a user message, or when ``force``); False when the save failed."""
        session = chat.session
        if not (force or any(m.role == "user" for m in session.messages)):
            return True
        try:
            with self.saving:
                if chat.file is not None:
                    session.save(chat.file)
                else:
                    chat.session_id = self.store.store.save(session, chat.session_id).id
        except Exception as error:  # noqa: BLE001  a failed save must not cost the reply its Done and update
            self._failed(chat, error)
            return False
        if chat.save_error is not None:
            self.send(p.Notice(f"Saved again: {self.where(chat)}"))
        chat.save_error = None
        if chat.file is None:
            self.send(self.store.listing())
        return True

    def _failed(self, chat: OpenChat, error: Exception) -> None:
        first = chat.save_error is None
        if isinstance(error, MlxchatError):
            chat.save_error, title = str(error), failure_title(error)
        else:  # a bug: say so with the trace, the chat stays
            chat.save_error, title = f"{type(error).__name__}: {error}", "Chat not saved"
            error = MlxchatError(chat.save_error + "\n\n" + traceback.format_exc(limit=4))
        if chat is not self.chats.on_screen:  # a chat answering in the background: it stays open here until saved
            self.send(p.Notice(f"“{chat.title}” was not saved ({chat.save_error}). It stays open in this window: "
                               "open it and press ctrl+s.", "error"))
        elif first:  # one dialog; while the trouble lasts, each later try is a notice
            self.send(p.Failure(title, with_hint(error, fatal=False), code=p.FailureCode.NOT_SAVED))
        else:
            self.send(p.Notice(f"The chat is still not saved: {chat.save_error}", "error"))

    def has_file(self, chat: OpenChat) -> bool:
        if chat.file is not None:
            return chat.file.exists()
        return chat.session_id is not None

    def file(self, chat: OpenChat) -> str | None:
        """The file autosave writes, once it exists."""
        if not self.has_file(chat):
            return None
        if chat.file is not None:
            return str(chat.file)
        assert chat.session_id is not None  # has_file
        return str(self.store.store.path_for(chat.session_id))

    def where(self, chat: OpenChat) -> str:
        return str(chat.file) if chat.file else f"session {chat.session_id}"
