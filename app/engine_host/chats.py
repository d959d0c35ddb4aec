"""The chats open in the engine host: the one on screen, and those kept in the background.

A chat leaves the screen when another comes on it. It stays open in the
background while it answers, waits for the user to pick a reply, or is unsaved;
otherwise it is let go (its cache blocks, its hold in the store, its file's lock).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.engine_host.open_chat import OpenChat
from app.engine_host.store_holder import StoreHolder
from mlxcore import MlxchatError

if TYPE_CHECKING:
    from sessions import ChatSession


class Chats:
    """The chat on screen (``on_screen``) and the ``background`` ones."""

    def __init__(self, store: StoreHolder) -> None:
        self.on_screen: OpenChat | None = None
        self.background: list[OpenChat] = []  # off screen, still answering (or waiting for a pick, or unsaved)
        self._store = store

    @property
    def screen(self) -> OpenChat:
        """The chat on screen; there is one once a model is open."""
        if self.on_screen is None:
            raise MlxchatError("No chat is open yet: wait for the model to load.")
        return self.on_screen

    def all(self) -> list[OpenChat]:
        return ([self.on_screen] if self.on_screen is not None else []) + self.background

    def held(self, session_id: str) -> OpenChat | None:
        """The chat with this id that is open here (on screen or in the background), if any."""
        return next((chat for chat in self.all() if chat.session_id == session_id), None)

    def idle_screen(self) -> OpenChat:
        """The chat on screen, when it may change: neither answering nor waiting for a pick."""
        chat = self.screen
        if chat.run is not None and chat.run.generating:
            raise MlxchatError("This chat is still answering: wait, or press Esc to stop it.")
        if chat.run is not None:
            raise MlxchatError(f"Pick one of the {chat.run.n} replies first (keys 1 to {chat.run.n}).")
        return chat

    def replace(self, session: ChatSession, session_id: str | None = None, file: Path | None = None,
                keep_old: bool = True) -> OpenChat:
        """Put ``session`` on screen (``show``). The same chat on a new session (a model switch) keeps its hold
        in the store and its file's lock."""
        chat, old = OpenChat(session, session_id, file), self.on_screen
        if old is not None and old.session is not session:
            if file is not None and file == old.file:
                chat.file_lock, old.file_lock = old.file_lock, None
            if session_id is not None and session_id == old.session_id:
                old.session_id = None  # the hold in the store goes with the chat
        self.show(chat, keep_old)
        return chat

    def show(self, chat: OpenChat, keep_old: bool = True) -> None:
        """Put ``chat`` on screen. The chat that was there is let go, unless ``keep_old`` and it still answers
        (or waits for a pick, or is unsaved): then it stays open in the background."""
        old, self.on_screen = self.on_screen, chat
        if chat in self.background:
            self.background.remove(chat)
        if old is None or old is chat or old.session is chat.session:
            return
        if keep_old and (old.run is not None or old.save_error is not None):
            self.background.append(old)
        else:
            old.release(self._store.opened)

    def let_go(self, chat: OpenChat) -> None:
        """Close a chat of the background."""
        self.background.remove(chat)
        chat.release(self._store.opened)

    def settle_aside(self, chat: OpenChat) -> None:
        """A chat in the background that has nothing left to do (its turn kept and saved) is let go."""
        if chat.run is None and chat.save_error is None and chat in self.background:
            self.let_go(chat)
