"""The engine host's session-store commands: open, list, rename, delete and export stored chats."""

from __future__ import annotations

from pathlib import Path

from app.engine_host import protocol as p
from app.engine_host.channel import SendEvent
from app.engine_host.chats import Chats
from app.engine_host.model_holder import ModelHolder
from app.engine_host.publisher import Publisher
from app.engine_host.store_holder import StoreHolder
from mlxcore import MlxchatError


class StoreJobs:
    """Serves OpenSession, ListSessions and ManageSession; a chat open here is changed where it is open."""

    def __init__(self, send: SendEvent, store: StoreHolder, chats: Chats, model: ModelHolder,
                 publisher: Publisher) -> None:
        self.send, self.store, self.chats, self.model, self.publisher = send, store, chats, model, publisher

    def open_session(self, command: p.OpenSession) -> None:
        held = self.chats.held(command.session_id)
        if held is not None:  # a chat still answering in the background: back on screen as it is
            self.chats.show(held)
        else:
            session = self.store.store.load(command.session_id, self.model.engine)
            self.chats.replace(session, command.session_id)
            self.publisher.restore_note(session)
        self.publisher.publish()

    def list_sessions(self, command: p.ListSessions) -> None:
        self.send(self.store.listing(command.query))

    def manage(self, command: p.ManageSession) -> None:
        store, sid = self.store.store, command.session_id
        held = self.chats.held(sid)
        if command.action == "rename":
            store.rename(sid, command.title or "")
            if held is not None:  # its next autosave keeps the new title
                held.session.title = command.title or None
            if held is not None and held is self.chats.on_screen:
                self.publisher.publish()
        elif command.action == "delete":
            self._delete(sid)
        elif command.action == "export":
            self._export(sid, command.path)
        else:
            raise MlxchatError(f"unknown session action {command.action!r}")
        self.send(self.store.listing())

    def _delete(self, sid: str) -> None:
        held = self.chats.held(sid)
        if held is not None and held.run is not None:
            raise MlxchatError(f"“{held.title}” is still answering: open it and stop it (Esc) first.")
        self.store.store.delete(sid)
        if held is not None and held is self.chats.on_screen:
            old = held.session
            self.chats.replace(self.model.new_session(old.system, old.params, old.enable_thinking), keep_old=False)
            self.publisher.publish()
        elif held is not None:  # unsaved, in the background: it goes with its stored copy
            self.chats.let_go(held)

    def _export(self, sid: str, path: str | None) -> None:
        held = self.chats.screen if not sid else self.chats.held(sid)
        text = self.store.store.export_markdown(held.session if held is not None else sid)
        target = Path(path or f"{_slug(self.chats.screen.title)}.md").expanduser()
        target.write_text(text, encoding="utf-8")
        self.send(p.Exported(str(target.resolve())))


def _slug(title: str) -> str:
    keep = "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")
    return "-".join(part for part in keep.split("-") if part)[:40] or "chat"
