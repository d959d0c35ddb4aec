"""The engine host's session store: opened on first use (a chat in a ``--session FILE`` never needs it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.engine_host import protocol as p

if TYPE_CHECKING:
    from sessions import SessionStore


class StoreHolder:
    """The SessionStore of this window, once something needed it."""

    def __init__(self) -> None:
        self.opened: SessionStore | None = None  # None until first used

    @property
    def store(self) -> SessionStore:
        if self.opened is None:
            from sessions import SessionStore
            self.opened = SessionStore()
        return self.opened

    def listing(self, query: str = "") -> p.Sessions:
        """The stored chats (those matching ``query``, when one is given), as the sidebar lists them."""
        infos = self.store.search(query) if query else self.store.list()
        return p.Sessions(query, tuple(p.SessionRow(i.id, i.title, float(i.updated), i.messages, bool(i.broken),
                                                    i.open_elsewhere) for i in infos))

    def close(self) -> None:
        """Let other windows open this one's chats (a host that ends before its process does)."""
        if self.opened is not None:
            self.opened.close()
