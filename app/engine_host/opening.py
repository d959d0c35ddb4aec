"""The engine host's Open command: load the models, open the first chat (new, stored, or a file).

Options given on the command line override what an opened chat saved. A
``--session FILE`` chat is locked while it is open here, as stored chats are, so
two windows never write the same file. An Open after the first switches the
model: the chat on screen goes on, its cache rebuilt.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.engine_host import protocol as p
from app.engine_host.autosave import Autosave
from app.engine_host.channel import SendEvent
from app.engine_host.chats import Chats
from app.engine_host.model_holder import ModelHolder
from app.engine_host.publisher import Publisher
from app.engine_host.store_jobs import StoreJobs
from mlxcore import MlxchatError

if TYPE_CHECKING:
    from app.engine_host.open_chat import OpenChat
    from mlxcore import GenerationParams
    from sessions import ChatSession, Message


class Opening:
    """Serves Open: the first one, and each model switch after it."""

    def __init__(self, send: SendEvent, model: ModelHolder, chats: Chats, store_jobs: StoreJobs,
                 autosave: Autosave, publisher: Publisher) -> None:
        self.send, self.model, self.chats, self.store_jobs = send, model, chats, store_jobs
        self.autosave, self.publisher = autosave, publisher

    def open(self, command: p.Open) -> None:
        if any(chat.run is not None for chat in self.chats.all()):
            raise MlxchatError("Chats are still answering (or waiting for a pick): let them end before switching "
                               "the model.")
        self.store_jobs.list_sessions(p.ListSessions())
        opened = self.model.load(command)
        self._let_go_of_background()
        self.model.use(opened)
        self.send(p.Ready(opened.engine.model_name, opened.engine.draft_name or None, opened.note, opened.engine.generation_defaults,
                          opened.engine.batches))
        if self.chats.on_screen is not None:
            self._switched(self.chats.on_screen)
            from mlxcore import release_models
            release_models()  # the old model's weights and caches, now unreferenced, and the buffers they leave
            return
        try:  # a session that cannot be opened leaves a new chat behind, and a dialog that says why
            if command.session_file:
                self._open_file(Path(command.session_file), command)
            elif command.session_id:
                self.store_jobs.open_session(p.OpenSession(command.session_id))
                self._apply_options(self.chats.screen.session, command)
        finally:
            if self.chats.on_screen is None:
                self.chats.replace(self.model.new_session(command.system, self._given_params(command),
                                                          command.think is not False,
                                                          messages=_messages(command.messages)))
            self.publisher.publish()

    def _switched(self, previous: OpenChat) -> None:
        """The chat on screen goes on with the new model: the same history and settings, a new cache."""
        old = previous.session
        session = self.model.new_session(old.system, old.params, old.enable_thinking, messages=old.messages,
                                         title=old.title)
        chat = self.chats.replace(session, previous.session_id, previous.file, keep_old=False)
        chat.save_error = previous.save_error
        self.publisher.publish()

    def _given_params(self, command: p.Open) -> GenerationParams:
        """A new chat's parameters: the model's recommended sampling, then the options given."""
        return self.model.engine.default_params.replaced(command.params)

    def _apply_options(self, session: ChatSession, command: p.Open) -> None:
        """The options given on the command line override the settings the opened chat was saved with."""
        if command.params:
            session.params = session.params.replaced(command.params)
        if command.think is not None:
            session.enable_thinking = command.think
        if command.system is not None:
            session.set_system(command.system)

    def _let_go_of_background(self) -> None:
        """Before a model switch: chats left unsaved in the background get one more try, then go."""
        for chat in list(self.chats.background):
            self.autosave.save(chat)
            self.chats.let_go(chat)

    def _open_file(self, path: Path, command: p.Open) -> None:
        from sessions import ChatSession
        from sessions import SessionLock
        lock = SessionLock.acquire(path, mark_open=True)  # SessionInUseError: open in another window
        if not path.exists():  # a new file: start a chat that autosaves there
            session = self.model.new_session(command.system, self._given_params(command), command.think is not False)
            self.chats.replace(session, file=path).file_lock = lock
            return
        try:
            session = ChatSession.load(path, self.model.engine)
        except BaseException:
            lock.release()
            raise
        self.chats.replace(session, file=path).file_lock = lock
        self.publisher.restore_note(session)
        self._apply_options(session, command)


def _messages(pairs: tuple[tuple[str, str], ...]) -> list[Message] | None:
    from sessions import Message
    return [Message(role, content) for role, content in pairs] if pairs else None
