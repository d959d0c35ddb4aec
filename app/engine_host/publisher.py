"""What the UI is told about the chat on screen: its whole state after every change of its shape."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from app.engine_host import protocol as p
from app.engine_host.autosave import Autosave
from app.engine_host.channel import SendEvent
from app.engine_host.chats import Chats
from app.engine_host.model_holder import ModelHolder
from app.flags import in_flags

if TYPE_CHECKING:
    from sessions import ChatSession


class Publisher:
    """Sends the chat on screen as a Conversation event."""

    def __init__(self, send: SendEvent, chats: Chats, model: ModelHolder, autosave: Autosave) -> None:
        self.send, self.chats, self.model, self.autosave = send, chats, model, autosave

    def publish(self) -> None:
        """Send the chat on screen: its settings, history and turn in progress (its replies so far)."""
        chat = self.chats.on_screen
        if chat is None:
            return
        s, run = chat.session, chat.run
        self.send(p.Conversation(
            session_id=chat.session_id, title=s.display_title(),
            messages=tuple((m.role, m.content) for m in s.messages if m.role != "system"),
            params=dataclasses.asdict(s.params), system=s.system, think=s.enable_thinking,
            use_draft=s.caches.draft is not None, has_draft=self.model.engine.draft_model is not None,
            save_error=chat.save_error, file=self.autosave.file(chat),
            turn=run.number if run is not None else 0, replies=run.so_far() if run is not None else ()))

    def restore_note(self, session: ChatSession) -> None:
        """A chat just loaded: what the user should know about it (e.g. its cache was rebuilt), if anything."""
        if session.restore_note:
            self.send(p.Notice(in_flags(session.restore_note), "warning"))
