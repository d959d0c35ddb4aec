"""The engine host: owns the Engine, the open chats and the session store; serves the UI's commands.

It runs on one thread (in the engine child process, or a thread in the
benchmark), so every MLX call happens on the thread that made the model. Its
loop takes the UI's commands one at a time and, while any chat has a reply in
progress, runs a step of the batching scheduler between them (replies.py).
"""

from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path
from typing import Any

from app.engine_host import protocol as p
from app.engine_host.channel import Channel
from app.engine_host.autosave import Autosave
from app.engine_host.opening import OpenCommands
from app.engine_host.replies import ReplyCommands
from app.engine_host.store_commands import StoreCommands
from app.engine_host.tools import ToolCommands
from app.engine_host.failure_text import failure_title, with_hint
from app.engine_host.inbox import Inbox
from app.engine_host.open_chat import OpenChat
from app.engine_host.reply_stream import FLUSH_SECONDS
from mlxcore import MlxchatError, PromptError


class EngineServer(ReplyCommands, ToolCommands, OpenCommands, Autosave, StoreCommands):
    """Handles the UI's commands; replies stream as batched chunks, every chat's on one scheduler."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel = channel
        self.inbox = Inbox(channel)
        self.opened: Any = None  # mlxcore.launch.OpenedEngine
        self.chat: OpenChat | None = None  # the chat on screen
        self.background: list[OpenChat] = []  # off screen, still answering (or waiting for a pick, or unsaved)
        self.batch: Any = None  # mlxcore.batching.local.LocalBatch (paged KV); None: one reply at a time
        self._store: Any = None
        self.flush_seconds = FLUSH_SECONDS

    def serve(self) -> None:
        """Answer commands until Shutdown (or the UI goes away), stepping the replies in progress between them."""
        while True:
            command = self.inbox.next(wait=not self.stepping)
            if isinstance(command, p.Shutdown):
                self._shut_down()
                return
            if command is not None:
                self.handle(command)
            if self.stepping:
                try:
                    self.advance()
                except Exception as error:  # noqa: BLE001  a bug must not take the chats down: report it
                    self.send(self._failure(error))

    def _shut_down(self) -> None:
        """Every reply stops and is kept; the chats are saved (a chat whose last save failed is tried once more)."""
        self._stop_every_turn()
        for chat in self._chats():
            if chat.save_error is not None:
                self._autosave(chat=chat)
        if self._store is not None:
            self._store.close()  # other windows may open its chats now (a thread host outlives this)

    def handle(self, command: Any) -> None:
        """Run one command; errors become Failure events, never a crash."""
        handler = getattr(self, "_on_" + type(command).__name__.lower(), None)
        try:
            if handler is None:
                raise MlxchatError(f"unknown command {type(command).__name__}")
            handler(command)
        except Exception as error:  # noqa: BLE001  a bug must not take the chat down: report it and go on
            self.send(self._failure(error, command))

    def _failure(self, error: BaseException, command: Any = None) -> p.Failure:
        """The Failure event that tells the user about ``error`` (raised by ``command``, if one)."""
        if not isinstance(error, MlxchatError):
            return p.Failure("Unexpected error", f"{type(error).__name__}: {error}\n\n"
                             + "".join(traceback.format_exception(error, limit=4)), fatal=self.opened is None)
        fatal = self.opened is None and isinstance(command, p.Open)
        opening = isinstance(command, (p.Open, p.OpenSession))
        refused = getattr(command, "text", None) if isinstance(error, PromptError) else None
        return p.Failure(failure_title(error, opening), with_hint(error, fatal, opening), fatal=fatal,
                         returned_text=refused)

    def send(self, event: Any) -> None:
        self.channel.send(event)

    @property
    def store(self) -> Any:
        if self._store is None:
            from sessions.store import SessionStore
            self._store = SessionStore()
        return self._store

    # the chat on screen, as the command mixins name it

    @property
    def session(self) -> Any:
        return self.chat.session if self.chat is not None else None

    @property
    def session_id(self) -> str | None:
        return self.chat.session_id if self.chat is not None else None

    @property
    def session_file(self) -> Path | None:
        return self.chat.file if self.chat is not None else None

    @property
    def save_error(self) -> str | None:
        return self.chat.save_error if self.chat is not None else None

    # settings and chat structure ----------------------------------------------------------

    def _on_configure(self, command: p.Configure) -> None:
        self._check_idle()
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
        if action != "new":  # a new chat leaves this one answering in the background
            self._check_idle()
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
        """Send the chat on screen: its settings, history and turn in progress (its replies so far)."""
        s, run = self.session, self.chat.run if self.chat is not None else None
        if s is None:
            return
        self.send(p.Conversation(
            session_id=self.session_id, title=s.display_title(),
            messages=tuple((m.role, m.content) for m in s.messages if m.role != "system"),
            params=dataclasses.asdict(s.params), system=s.system, think=s.enable_thinking,
            use_draft=s.caches.draft is not None, has_draft=self.opened.engine.draft_model is not None,
            save_error=self.save_error, file=self._file(),
            turn=run.number if run is not None else 0, replies=run.so_far() if run is not None else ()))

