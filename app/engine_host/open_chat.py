"""A chat the engine host holds: the one on screen, or one still answering (or unsaved) in the background."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from app.engine_host.reply_run import ReplyRun
    from sessions import ChatSession, SessionStore


class FileLock(Protocol):
    """The lock of a ``--session FILE`` chat's file (sessions' SessionLock), held while the chat is open here."""

    def release(self) -> None: ...


@dataclass(eq=False)
class OpenChat:
    """A ChatSession with where it is saved, and its turn in progress, if any."""

    session: ChatSession
    session_id: str | None = None  # in the store; None until first saved (or for a file)
    file: Path | None = None  # mlxchat --session FILE: autosave goes there
    file_lock: FileLock | None = None
    save_error: str | None = None  # why the last save failed; None when the file holds this state
    run: ReplyRun | None = None  # the turn in progress (or waiting for a pick)

    @property
    def answering(self) -> bool:
        """A reply is still being generated."""
        return self.run is not None and self.run.generating

    @property
    def title(self) -> str:
        return str(self.session.display_title())

    def release(self, store: SessionStore | None) -> None:
        """Let go of the chat: its caches' blocks, its hold in the store, its file's lock."""
        self.session.caches.release()
        if self.session_id is not None and store is not None:
            store.release(self.session_id)  # another window can open it now
        if self.file_lock is not None:
            self.file_lock.release()
            self.file_lock = None
