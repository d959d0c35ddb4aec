"""The engine host's session-store commands: open, list, rename, delete and export stored chats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.tui import protocol as p
from mlxcore.errors import MlxchatError


class StoreCommands:
    """Mixed into EngineServer; uses its store, session, session_id, send, _publish and _replace_session."""

    store: Any
    session: Any
    session_id: str | None
    opened: Any

    def _on_opensession(self, command: p.OpenSession) -> None:
        session = self.store.load(command.session_id, self.opened.engine)
        self._replace_session(session, command.session_id)
        self._tell_restore_note()
        self._publish()

    def _tell_restore_note(self) -> None:
        note = getattr(self.session, "restore_note", None)
        if note:
            self.send(p.Notice(note, "warning"))

    def _on_listsessions(self, command: p.ListSessions) -> None:
        infos = self.store.search(command.query) if command.query else self.store.list()
        rows = tuple(p.SessionRow(i.id, i.title, float(i.updated), i.messages, bool(i.broken), i.open_elsewhere)
                     for i in infos)
        self.send(p.Sessions(command.query, rows))

    def _on_managesession(self, command: p.ManageSession) -> None:
        store, sid = self.store, command.session_id
        if command.action == "rename":
            store.rename(sid, command.title or "")
            if sid == self.session_id:
                self.session.title = command.title or None
                self._publish()
        elif command.action == "delete":
            store.delete(sid)
            if sid == self.session_id:
                old = self.session
                self._replace_session(self._new_session(old.system, old.params, old.enable_thinking))
                self._publish()
        elif command.action == "export":
            self._export(sid, command.path)
        else:
            raise MlxchatError(f"unknown session action {command.action!r}")
        self._on_listsessions(p.ListSessions())

    def _export(self, sid: str, path: str | None) -> None:
        source = self.session if sid == self.session_id or not sid else sid
        text = self.store.export_markdown(source)
        target = Path(path or f"{_slug(self.session.display_title())}.md").expanduser()
        target.write_text(text, encoding="utf-8")
        self.send(p.Exported(str(target.resolve())))


def _slug(title: str) -> str:
    keep = "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")
    return "-".join(part for part in keep.split("-") if part)[:40] or "chat"
