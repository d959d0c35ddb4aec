"""The engine host: owns the Engine, the open ChatSession and the session store; serves the UI's commands.

It runs on one thread (in the engine child process, or a thread in the
benchmark), so every MLX call happens on the thread that made the model.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from pathlib import Path
from typing import Any

from app.tui import protocol as p
from app.tui.channel import Channel
from app.tui.engine_autosave import Autosave
from app.tui.engine_open import OpenCommands
from app.tui.engine_store import StoreCommands
from app.tui.failure_text import failure_title, with_hint
from app.tui.inbox import Inbox
from app.tui.reply_stream import FLUSH_SECONDS, done_event, relay_reply
from mlxcore.errors import MlxchatError, PromptError

PREFILL_EVERY_S = 0.25  # prompt-reading progress


class EngineServer(OpenCommands, Autosave, StoreCommands):
    """Handles one command at a time; replies stream as batched chunks."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel = channel
        self.inbox = Inbox(channel)
        self.opened: Any = None  # mlxcore.launch.OpenedEngine
        self.session: Any = None  # sessions.chat_session.ChatSession
        self.session_id: str | None = None  # in the store; None until first saved (or for a file)
        self.session_file: Path | None = None  # mlxchat --session FILE: autosave goes there
        self._store: Any = None
        self.flush_seconds = FLUSH_SECONDS
        self._prefill_sent = 0.0

    def serve(self) -> None:
        """Answer commands until Shutdown (or the UI goes away); a chat whose last save failed is tried once more."""
        while True:
            command = self.inbox.next()
            if isinstance(command, p.Shutdown):
                if self.save_error is not None:
                    self._autosave()
                if self._store is not None:
                    self._store.close()  # other windows may open its chats now (a thread host outlives this)
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
            opening = isinstance(command, (p.Open, p.OpenSession))
            refused = getattr(command, "text", None) if isinstance(error, PromptError) else None
            self.send(p.Failure(failure_title(error, opening), with_hint(error, fatal, opening), fatal=fatal,
                                returned_text=refused))
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
        self.session.prefill_progress = self._prefill_progress
        last, failed = time.monotonic(), True
        try:
            last = relay_reply(chunks, self.send, self.inbox.stop_asked, self.flush_seconds)
            failed = False
        finally:
            self.send(done_event(self.session.last_stats, self.opened.engine.context_length, last, failed,
                                 cut_in_thinking=self.session.cut_in_thinking))
            self._autosave()
            self._publish()

    def _prefill_progress(self, done: int, total: int) -> None:
        """Between prefill chunks: stop when asked, and say how far the prompt is read.

        A chat that has no file yet is saved as prefill starts, so that the user's
        message survives whatever happens to this process during the reply.
        """
        from mlxcore.prefill import StopPrefill
        if self.inbox.stop_asked():
            raise StopPrefill
        now = time.monotonic()
        if done == 0:
            self._prefill_sent = 0.0
            if not self._has_file():
                self._autosave()
                self._publish()
        if now - self._prefill_sent >= PREFILL_EVERY_S:
            self._prefill_sent = now
            self.send(p.Prefill(done, total))

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
            if self._autosave(force=True):
                self.send(p.Notice(f"Saved: {self._where()}"))
            self._publish()
            return
        else:
            raise MlxchatError(f"unknown chat action {action!r}")
        self._autosave()
        self._publish()

    def _publish(self) -> None:
        s = self.session
        if s is None:
            return
        self.send(p.Conversation(
            session_id=self.session_id, title=s.display_title(),
            messages=tuple((m.role, m.content) for m in s.messages if m.role != "system"),
            params=dataclasses.asdict(s.params), system=s.system, think=s.enable_thinking,
            use_draft=s.caches.draft is not None, has_draft=self.opened.engine.draft_model is not None,
            save_error=self.save_error, file=self._file()))

