"""The engine host's session-store commands: open, list, rename, delete and export stored chats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.engine_host import protocol as p
from app.engine_host.open_chat import OpenChat
from mlxcore import MlxchatError
from app.flags import in_flags


class StoreCommands:
    """Mixed into EngineServer; uses its store, chat (on screen), background, session, session_id, send,
    _publish, _show, _replace_session, _new_session and _chats."""

    store: Any
    chat: OpenChat | None
    background: list[OpenChat]
    session: Any
    session_id: str | None
    opened: Any

    def _on_opensession(self, command: p.OpenSession) -> None:
        held = self._held(command.session_id)
        if held is not None:  # a chat still answering in the background: back on screen as it is
            self._show(held)
        else:
            session = self.store.load(command.session_id, self.opened.engine)
            self._replace_session(session, command.session_id)
            self._tell_restore_note()
        self._publish()

    def _held(self, session_id: str) -> OpenChat | None:
        """The chat with this id that is open here (on screen or in the background), if any."""
        return next((chat for chat in self._chats() if chat.session_id == session_id), None)

    def _tell_restore_note(self) -> None:
        note = getattr(self.session, "restore_note", None)
        if note:
            self.send(p.Notice(in_flags(note), "warning"))

    def _on_listsessions(self, command: p.ListSessions) -> None:
        infos = self.store.search(command.query) if command.query else self.store.list()
        rows = tuple(p.SessionRow(i.id, i.title, float(i.updated), i.messages, bool(i.broken), i.open_elsewhere)
                     for i in infos)
        self.send(p.Sessions(command.query, rows))

    def _on_managesession(self, command: p.ManageSession) -> None:
        store, sid = self.store, command.session_id
        held = self._held(sid)
        if command.action == "rename":
            store.rename(sid, command.title or "")
            if held is not None:  # its next autosave keeps the new title
                held.session.title = command.title or None
            if held is self.chat:
                self._publish()
        elif command.action == "delete":
            if held is not None and held.run is not None:
                raise MlxchatError(f"“{held.title}” is still answering: open it and stop it (Esc) first.")
            store.delete(sid)
            if held is self.chat:
                old = self.session
                self._replace_session(self._new_session(old.system, old.params, old.enable_thinking),
                                      keep_old=False)
                self._publish()
            elif held is not None:  # unsaved, in the background: it goes with its stored copy
                self.background.remove(held)
                held.release(self._store)
        elif command.action == "export":
            self._export(sid, command.path)
        else:
            raise MlxchatError(f"unknown session action {command.action!r}")
        self._on_listsessions(p.ListSessions())

    def _export(self, sid: str, path: str | None) -> None:
        held = self.chat if not sid else self._held(sid)
        source = held.session if held is not None else sid
        text = self.store.export_markdown(source)
        target = Path(path or f"{_slug(self.session.display_title())}.md").expanduser()
        target.write_text(text, encoding="utf-8")
        self.send(p.Exported(str(target.resolve())))


def _slug(title: str) -> str:
    keep = "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")
    return "-".join(part for part in keep.split("-") if part)[:40] or "chat"
