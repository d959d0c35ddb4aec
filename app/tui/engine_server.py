"""The engine host: owns the Engine, the open ChatSession and the session store; serves the UI's commands.

It runs on one thread (in the engine child process, or a thread in the
benchmark), so every MLX call happens on the thread that made the model.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

from app.tui import protocol as p
from app.tui.channel import Channel
from app.tui.engine_store import StoreCommands
from app.tui.failure_text import failure_title, with_hint
from app.tui.reply_stream import FLUSH_SECONDS, done_event, relay_reply
from mlxcore.errors import MlxchatError

PROGRESS_EVERY_S = 0.1


class EngineServer(StoreCommands):
    """Handles one command at a time; replies stream as batched chunks."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.opened: Any = None  # mlxcore.launch.OpenedEngine
        self.session: Any = None  # sessions.chat_session.ChatSession
        self.session_id: str | None = None  # in the store; None until first saved (or for a file)
        self.session_file: Path | None = None  # mlxchat --session FILE: autosave goes there
        self._store: Any = None
        self._deferred: deque[Any] = deque()
        self.flush_seconds = FLUSH_SECONDS

    def serve(self) -> None:
        """Answer commands until Shutdown (or the UI goes away)."""
        while True:
            command = self._deferred.popleft() if self._deferred else self.channel.receive()
            if isinstance(command, p.Shutdown):
                return
            self.handle(command)

    def handle(self, command: Any) -> None:
        """Run one command; errors become Failure events, never a crash."""
        handler = getattr(self, "_on_" + type(command).__name__.lower(), None)
        try:
            if handler is None:
                raise MlxchatError(f"unknown command {type(command).__name__}")
            handler(command)
        except MlxchatError as error:
            fatal = self.opened is None and isinstance(command, p.Open)
            self.send(p.Failure(failure_title(error), with_hint(error, fatal), fatal=fatal))
        except Exception as error:  # a bug must not take the chat down: report it and go on
            self.send(p.Failure("Unexpected error", f"{type(error).__name__}: {error}\n\n"
                                + traceback.format_exc(limit=4), fatal=self.opened is None))

    def send(self, event: Any) -> None:
        self.channel.send(event)

    @property
    def store(self) -> Any:
        if self._store is None:
            from sessions.store import SessionStore
            self._store = SessionStore()
        return self._store

    # opening ------------------------------------------------------------------------

    def _on_open(self, command: p.Open) -> None:
        from mlxcore.engine import KVConfig
        from mlxcore.launch import ModelChoice, open_engine
        from mlxcore.params import GenerationParams

        self._on_listsessions(p.ListSessions())
        kv = KVConfig(kind=command.kv, max_kv=command.max_kv, block_size=command.block_size)
        choice = ModelChoice(model=command.model, draft=command.draft, no_draft=command.no_draft)
        opened = open_engine(choice, kv, progress=self._progress_reporter(),
                             notice=lambda text: self.send(p.Notice(text[0].upper() + text[1:])))
        if command.ignore_eos:
            opened.engine.eos_ids = set()
        self.flush_seconds = command.flush_seconds
        previous, self.opened = self.session, opened
        self.send(p.Ready(opened.target_name, opened.draft_name, opened.note))
        if previous is not None:  # switching models: the conversation continues, its cache is rebuilt
            self._replace_session(self._new_session(previous.system, previous.params, previous.enable_thinking,
                                                    messages=previous.messages, title=previous.title),
                                  self.session_id, self.session_file)
            self._publish()
            return
        try:  # a session that cannot be opened leaves a new chat behind, and a dialog that says why
            if command.session_file:
                self._open_file(Path(command.session_file))
            elif command.session_id:
                self._on_opensession(p.OpenSession(command.session_id))
        finally:
            if self.session is None:
                self._replace_session(self._new_session(command.system, GenerationParams(**command.params),
                                                        command.think, messages=_messages(command.messages)))
            self._publish()

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

    def _replace_session(self, session: Any, session_id: str | None = None, file: Path | None = None) -> None:
        if self.session is not None and self.session is not session:
            self.session.caches.release()
        self.session, self.session_id, self.session_file = session, session_id, file

    def _open_file(self, path: Path) -> None:
        from sessions.chat_session import ChatSession
        if path.exists():
            self._replace_session(ChatSession.load(path, self.opened.engine), file=path)
            self._tell_restore_note()
        else:  # a new file: start a chat that autosaves there
            self._replace_session(self._new_session(None, self._params(), True), file=path)

    def _params(self) -> Any:
        from mlxcore.params import GenerationParams
        return self.session.params if self.session is not None else GenerationParams()

    # replies ------------------------------------------------------------------------

    def _on_send(self, command: p.Send) -> None:
        self._reply(self.session.stream(command.text))

    def _on_regenerate(self, command: p.Regenerate) -> None:
        self._reply(self.session.stream_regenerate())

    def _on_editlast(self, command: p.EditLast) -> None:
        self._reply(self.session.stream_edit_last_user(command.text))

    def _on_stop(self, command: p.Stop) -> None:
        pass  # nothing is being generated

    def _reply(self, chunks: Any) -> None:
        self._publish()  # the UI shows the user's message (and drops a replaced reply)
        poll = lambda: self.channel.receive(timeout=0)  # noqa: E731
        last, failed = time.monotonic(), True
        try:
            last = relay_reply(chunks, self.send, poll, self._deferred.append, self.flush_seconds)
            failed = False
        finally:
            self.send(done_event(self.session.last_stats, self.opened.engine.context_length, last, failed))
            self._autosave()
            self._publish()

    # settings and chat structure ----------------------------------------------------------

    def _on_configure(self, command: p.Configure) -> None:
        session = self.session
        if command.params is not None:
            try:
                session.params = dataclasses.replace(session.params, **command.params)
            except (ValueError, TypeError) as error:
                raise MlxchatError(f"Settings not applied: {error}") from None
        if command.system is not None:
            session.set_system(command.system or None)
        if command.think is not None:
            session.enable_thinking = command.think
        if command.use_draft is not None:
            self._set_draft(command.use_draft)
        self._autosave()
        self._publish()

    def _set_draft(self, on: bool) -> None:
        engine, session = self.opened.engine, self.session
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

    def _on_chat(self, command: p.Chat) -> None:
        action = command.action
        if action == "new":
            old = self.session
            self._replace_session(self._new_session(old.system, old.params, old.enable_thinking))
        elif action == "fork":
            twin = self.session.fork()
            twin.title = f"{self.session.display_title()} (fork)"
            self._replace_session(twin)  # releasing the parent's caches only drops its references to shared blocks
        elif action == "clear":
            self.session.clear()
        elif action == "save":
            self._autosave(force=True)
            self.send(p.Notice(f"Saved: {self._where()}"))
            return
        else:
            raise MlxchatError(f"unknown chat action {action!r}")
        self._autosave()
        self._publish()

    def _autosave(self, force: bool = False) -> None:
        session = self.session
        if session is None or not (force or any(m.role == "user" for m in session.messages)):
            return
        if self.session_file is not None:
            session.save(self.session_file)
        else:
            self.session_id = self.store.save(session, self.session_id).id
            self._on_listsessions(p.ListSessions())

    def _where(self) -> str:
        return str(self.session_file) if self.session_file else f"session {self.session_id}"

    def _publish(self) -> None:
        s = self.session
        if s is None:
            return
        self.send(p.Conversation(
            session_id=self.session_id, title=s.display_title(),
            messages=tuple((m.role, m.content) for m in s.messages if m.role != "system"),
            params=dataclasses.asdict(s.params), system=s.system, think=s.enable_thinking,
            use_draft=s.caches.draft is not None, has_draft=self.opened.engine.draft_model is not None))


def _messages(pairs: tuple[tuple[str, str], ...]) -> list[Any] | None:
    from sessions.messages import Message
    return [Message(role, content) for role, content in pairs] if pairs else None
