"""The engine host's opening commands: load the models, open the first chat (new, stored, or a file).

Options given on the command line override what an opened chat saved. A
``--session FILE`` chat is locked while it is open here, as stored chats are, so
two windows never write the same file.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from app.engine_host import protocol as p
from app.engine_host.open_chat import OpenChat
from mlxcore import MlxchatError

PROGRESS_EVERY_S = 0.1  # download progress


class OpenCommands:
    """Mixed into EngineServer; uses its opened, chat (on screen), background, batch, session, session_id,
    session_file, store, send, _publish, _autosave, _on_listsessions, _on_opensession and _tell_restore_note."""

    opened: Any
    chat: OpenChat | None
    background: list[OpenChat]
    batch: Any
    session: Any
    session_id: str | None
    session_file: Path | None
    store: Any
    _store: Any

    def _on_open(self, command: p.Open) -> None:
        from mlxcore import KVConfig
        from mlxcore import ModelChoice, open_engine

        if any(chat.run is not None for chat in self._chats()):
            raise MlxchatError("Chats are still answering (or waiting for a pick): let them end before switching "
                               "the model.")
        self._on_listsessions(p.ListSessions())
        kv = KVConfig(kind=command.kv, max_kv=command.max_kv, block_size=command.block_size,
                      max_kv_bytes=command.max_kv_bytes, kv_bits=command.kv_bits)
        choice = ModelChoice(model=command.model, draft=command.draft, no_draft=command.no_draft)
        opened = open_engine(choice, kv, progress=self._progress_reporter(), num_draft=command.num_draft,
                             notice=lambda text: self.send(p.Notice(text[0].upper() + text[1:])))
        self.flush_seconds = command.flush_seconds
        self._let_go_of_background()
        previous, self.opened = self.session, opened
        self.batch = _scheduler(opened.engine)
        self.send(p.Ready(opened.target_name, opened.draft_name, opened.note, opened.engine.generation_defaults))
        if previous is not None:  # switching models: the conversation continues, its cache is rebuilt
            unsaved = self.chat.save_error
            self._replace_session(self._new_session(previous.system, previous.params, previous.enable_thinking,
                                                    messages=previous.messages, title=previous.title),
                                  self.session_id, self.session_file, keep_old=False)
            self.chat.save_error = unsaved
            self._publish()
            return
        try:  # a session that cannot be opened leaves a new chat behind, and a dialog that says why
            if command.session_file:
                self._open_file(Path(command.session_file), command)
            elif command.session_id:
                self._on_opensession(p.OpenSession(command.session_id))
                self._apply_options(command)
        finally:
            if self.session is None:
                self._replace_session(self._new_session(command.system, self._given_params(command),
                                                        command.think is not False,
                                                        messages=_messages(command.messages)))
            self._publish()

    def _given_params(self, command: p.Open) -> Any:
        """A new chat's parameters: the model's recommended sampling, then the options given."""
        return dataclasses.replace(self.opened.engine.default_params, **command.params)

    def _apply_options(self, command: p.Open) -> None:
        """The options given on the command line override the settings the opened chat was saved with."""
        session = self.session
        if command.params:
            session.params = dataclasses.replace(session.params, **command.params)
        if command.think is not None:
            session.enable_thinking = command.think
        if command.system is not None:
            session.set_system(command.system)

    def _progress_reporter(self):
        last = [0.0]

        def report(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or done >= total:
                last[0] = now
                self.send(p.Progress(done, total))
        return report

    def _new_session(self, system: str | None, params: Any, think: bool, messages: list[Any] | None = None,
                     title: str | None = None) -> Any:
        """A ChatSession on the open engine (``messages``: start from this history)."""
        from sessions.chat_session import ChatSession
        session = ChatSession(self.opened.engine, system, params, enable_thinking=think)
        if messages is not None:  # the system prompt given wins over one in the messages
            rest = [m for m in messages if m.role != "system"]
            session.messages = (session.messages[:1] if system else []) + rest
        session.title = title
        return session

    def _replace_session(self, session: Any, session_id: str | None = None, file: Path | None = None,
                         keep_old: bool = True) -> None:
        """Put ``session`` on screen (``_show``). The same chat on a new session (a model switch) keeps its hold
        in the store and its file's lock."""
        chat, old = OpenChat(session, session_id, file), self.chat
        if old is not None and old.session is not session:
            if file is not None and file == old.file:
                chat.file_lock, old.file_lock = old.file_lock, None
            if session_id is not None and session_id == old.session_id:
                old.session_id = None  # the hold in the store goes with the chat
        self._show(chat, keep_old)

    def _show(self, chat: OpenChat, keep_old: bool = True) -> None:
        """Put ``chat`` on screen. The chat that was there is let go, unless ``keep_old`` and it still answers
        (or waits for a pick, or is unsaved): then it stays open in the background."""
        old, self.chat = self.chat, chat
        if chat in self.background:
            self.background.remove(chat)
        if old is None or old is chat or old.session is chat.session:
            return
        if keep_old and (old.run is not None or old.save_error is not None):
            self.background.append(old)
        else:
            old.release(self._store)

    def _let_go_of_background(self) -> None:
        """Before a model switch: chats left unsaved in the background get one more try, then go."""
        for chat in list(self.background):
            self._autosave(chat=chat)
            self.background.remove(chat)
            chat.release(self._store)

    def _open_file(self, path: Path, command: p.Open) -> None:
        from sessions.chat_session import ChatSession
        from sessions.store_lock import SessionLock
        lock = SessionLock.acquire(path, mark_open=True)  # SessionInUseError: open in another window
        if path.exists():
            try:
                session = ChatSession.load(path, self.opened.engine)
            except BaseException:
                lock.release()
                raise
            self._replace_session(session, file=path)
            self.chat.file_lock = lock
            self._tell_restore_note()
            self._apply_options(command)
        else:  # a new file: start a chat that autosaves there
            self._replace_session(self._new_session(command.system, self._given_params(command),
                                                    command.think is not False), file=path)
            self.chat.file_lock = lock


def _scheduler(engine: Any) -> Any:
    """The batching scheduler every chat's replies run on; None when the KV cache is not paged (it needs it)."""
    if engine.kv.kind != "paged":
        return None
    from mlxcore.batching.local import LocalBatch
    return LocalBatch(engine)


def _messages(pairs: tuple[tuple[str, str], ...]) -> list[Any] | None:
    from sessions.messages import Message
    return [Message(role, content) for role, content in pairs] if pairs else None
