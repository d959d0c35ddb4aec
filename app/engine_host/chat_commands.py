"""The engine host's commands on the chat on screen itself: its settings (Configure) and its shape (Chat)."""

from __future__ import annotations


from app.engine_host import protocol as p
from app.engine_host.autosave import Autosave
from app.engine_host.channel import SendEvent
from app.engine_host.chats import Chats
from app.engine_host.model_holder import ModelHolder
from app.engine_host.open_chat import OpenChat
from app.engine_host.publisher import Publisher
from mlxcore import MlxchatError


class ChatCommands:
    """Serves Configure and Chat (new, fork, clear, save)."""

    def __init__(self, send: SendEvent, chats: Chats, model: ModelHolder, autosave: Autosave,
                 publisher: Publisher) -> None:
        self.send, self.chats, self.model, self.autosave, self.publisher = send, chats, model, autosave, publisher

    def configure(self, command: p.Configure) -> None:
        chat = self.chats.idle_screen()
        session = chat.session
        if command.params is not None:
            try:
                session.params = session.params.replaced(command.params)
            except (ValueError, TypeError) as error:
                raise MlxchatError(f"Settings not applied: {error}") from None
        if command.system is not None:
            session.set_system(command.system or None)
        if command.think is not None:
            session.enable_thinking = command.think
        if command.use_draft is not None:
            self._set_draft(chat, command.use_draft)
        self.autosave.save(chat)
        self.publisher.publish()

    def _set_draft(self, chat: OpenChat, on: bool) -> None:
        engine, session = self.model.engine, chat.session
        if on and engine.draft_model is None:
            raise MlxchatError("There is no draft model: start mlxchat with --draft REF to use one.")
        if on and session.caches.draft is None:
            fresh = engine.new_caches()  # its draft cache is refilled by prefill on the next reply
            fresh.target.release()
            session.caches.draft = fresh.draft
        if not on and session.caches.draft is not None:
            session.caches.draft.release()
            session.caches.draft = None
        session.use_draft = on

    def chat(self, command: p.Chat) -> None:
        action = command.action
        # a new chat leaves this one answering in the background; the others change the chat on screen
        chat = self.chats.screen if action == "new" else self.chats.idle_screen()
        session = chat.session
        if action == "new":
            self.chats.replace(self.model.new_session(session.system, session.params, session.enable_thinking))
        elif action == "fork":
            twin = session.fork()
            twin.title = f"{session.display_title()} (fork)"
            self.chats.replace(twin)  # releasing the parent's caches only drops its references to shared blocks
        elif action == "clear":
            session.clear()
        elif action == "save":
            if self.autosave.save(chat, force=True):
                self.send(p.Notice(f"Saved: {self.autosave.where(chat)}"))
            self.publisher.publish()
            return
        else:
            raise MlxchatError(f"unknown chat action {action!r}")
        self.autosave.save(self.chats.screen)
        self.publisher.publish()
