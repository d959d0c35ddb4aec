"""The engine host's replies: every chat's turn on one batching scheduler, run between the UI's commands.

A turn starts with Send, Regenerate or EditLast (``n`` replies side by side for
the first two). The host's loop (``EngineServer.serve``) then alternates between
the UI's commands and ``advance``: one scheduler step for every turn in progress,
whichever chat it belongs to. The chat on screen streams to the UI; a chat in
the background goes on, is kept and autosaved when its reply ends, and shows it
all when it comes back on screen. A single reply is kept as it ends;
alternatives wait for the user's Pick. Stop stops the turn of the chat on screen
only. With a KV cache other than paged, there is no scheduler: a reply runs to
its end before the next command, as ``sync_reply`` does it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from app.engine_host import protocol as p
from app.engine_host.sync_reply import SyncReply
from app.engine_host.open_chat import OpenChat
from app.engine_host.reply_run import ReplyRun
from mlxcore import MlxchatError, PromptError

_turns = itertools.count(1)


class SideBySideError(PromptError):
    """Several replies at once were asked for on a KV cache that is not paged (the scheduler needs it)."""


class ReplyCommands(SyncReply):
    """Mixed into EngineServer; uses its chat, background, batch, opened, _store, send, _publish, _autosave,
    _has_file, _failure, and ToolCommands' _offer_tools and _tell_tool_calls."""

    chat: OpenChat | None
    background: list[OpenChat]
    batch: Any  # mlxcore.batching.local.LocalBatch; None when the KV cache is not paged
    opened: Any
    flush_seconds: float
    _told: p.Generating | None = None

    # commands -----------------------------------------------------------------------------

    def _on_send(self, command: p.Send) -> None:
        self._start(command.n, lambda s, batch, n: s.start_turn(command.text, batch, n),
                    lambda s: s.stream(command.text))

    def _on_regenerate(self, command: p.Regenerate) -> None:
        self._start(command.n, lambda s, batch, n: s.start_regenerate(batch, n), lambda s: s.stream_regenerate())

    def _on_editlast(self, command: p.EditLast) -> None:
        self._start(1, lambda s, batch, n: start_edit(s, command.text, batch),
                    lambda s: s.stream_edit_last_user(command.text))

    def _on_stop(self, command: p.Stop) -> None:
        if self.chat is not None and self.chat.answering:
            self.chat.run.stop()

    def _on_pick(self, command: p.Pick) -> None:
        run = self.chat.run
        if run is None or run.n == 1:
            raise MlxchatError("There are no replies to pick from.")
        if not 0 <= command.choice < run.n:
            raise MlxchatError(f"There are {run.n} replies: pick one of 1 to {run.n}.")
        self._finish(self.chat, command.choice)

    def _check_idle(self) -> None:
        """Refuse to change the chat on screen while it answers or waits for a pick."""
        run = self.chat.run if self.chat is not None else None
        if run is not None and run.generating:
            raise MlxchatError("This chat is still answering: wait, or press Esc to stop it.")
        if run is not None:
            raise MlxchatError(f"Pick one of the {run.n} replies first (keys 1 to {run.n}).")

    def _start(self, n: int, batched: Callable[..., Any], streamed: Callable[[Any], Any]) -> None:
        self._check_idle()
        self._offer_tools(self.session)
        if self.batch is None and n == 1:
            self._reply(streamed(self.session))
            return
        chat = self.chat
        try:
            if self.batch is None:
                raise SideBySideError("This chat's KV cache is not paged, and only the paged one generates "
                                      "several replies at once.")
            turn = batched(chat.session, self.batch, n)
        except Exception:  # refused before any work (too long, no room): the chat is as it was
            self.send(p.Done("error", {}, time.monotonic()))
            self._publish()
            raise
        chat.run = ReplyRun(turn, next(_turns), self.flush_seconds)
        if not self._has_file():  # the user's message survives whatever happens to this process during the reply
            self._autosave()
        self._publish()
        chat.run.started(self.send)
        self._tell_generating()

    # the scheduler's steps ----------------------------------------------------------------------

    def _chats(self) -> list[OpenChat]:
        return ([self.chat] if self.chat is not None else []) + self.background

    @property
    def stepping(self) -> bool:
        """Some turn is still generating: the loop runs steps between commands."""
        return any(chat.answering for chat in self._chats())

    def advance(self) -> None:
        """One scheduler step; then every turn relays what came, and those that ended are finished."""
        answering = [chat for chat in self._chats() if chat.answering]
        self._step()
        for chat in answering:
            chat.run.pump(self.send if chat is self.chat else None)
            if not chat.answering:
                self._ended(chat)

    def _step(self) -> None:
        if not self.batch.busy:
            return
        try:
            self.batch.step()
        except Exception as error:  # noqa: BLE001  the engine failed mid-step: every turn ends with the error
            self._restart_batch(error)

    def _restart_batch(self, error: BaseException) -> None:
        """A step raised: its requests fail with the error (what they generated stays; their caches go back
        to the pool); a new scheduler."""
        from mlxcore.batching.local import LocalBatch
        self.batch.runner.fail_all(error)
        self.batch = LocalBatch(self.opened.engine)

    def _ended(self, chat: OpenChat) -> None:
        """A turn stopped generating: a single reply is kept now; alternatives wait for the user's pick."""
        run = chat.run
        if run.n == 1:
            self._finish(chat, 0)
            return
        self._tell_generating()
        if run.error is not None:
            self._report(chat, run.error)

    def _finish(self, chat: OpenChat, choice: int) -> None:
        """Keep reply ``choice`` of the chat's turn, say so, and autosave the chat."""
        run, on_screen = chat.run, chat is self.chat
        try:
            run.keep(choice)
        finally:  # whatever happens, the chat is not left waiting for a turn that is over
            chat.run = None
        if on_screen:
            self.send(run.done(choice, self.opened.engine.context_length, chat.session.cut_in_thinking))
        self._autosave(chat=chat)
        if on_screen:
            self._publish()
            self._tell_tool_calls(chat.session, run.ended[choice])
        else:
            self._settle_aside(chat)
        self._tell_generating()
        if run.error is not None and run.n == 1:
            self._report(chat, run.error)

    def _report(self, chat: OpenChat, error: BaseException) -> None:
        if chat is self.chat:
            self.send(self._failure(error))
        else:
            self.send(p.Notice(f"“{chat.title}” stopped answering: {error}", "error"))

    def _settle_aside(self, chat: OpenChat) -> None:
        """A chat in the background that has nothing left to do (its turn kept and saved) is let go."""
        if chat.run is None and chat.save_error is None and chat in self.background:
            self.background.remove(chat)
            chat.release(self._store)

    def _tell_generating(self) -> None:
        """Tell the UI which stored chats are answering (and which wait for a pick), when that changed."""
        chats = [chat for chat in self._chats() if chat.session_id is not None and chat.run is not None]
        told = p.Generating(tuple(c.session_id for c in chats if c.answering),
                            tuple(c.session_id for c in chats if not c.answering))
        if told != self._told:
            self._told = told
            self.send(told)

    def _stop_every_turn(self) -> None:
        """Quitting: every turn stops, and each chat keeps its reply so far (the first of its alternatives)."""
        for chat in self._chats():
            if chat.run is not None:
                chat.run.stop()
        for chat in self._chats():
            if chat.run is not None:
                self._finish(chat, 0)


def start_edit(session: Any, text: str, batch: Any) -> Any:
    """``stream_edit_last_user`` on the scheduler: the last user message replaced, then answered again."""
    users = [i for i, m in enumerate(session.messages) if m.role == "user"]
    if not users:
        raise PromptError("There is no message to edit yet.")
    before = list(session.messages)
    session.messages = session.messages[:users[-1]]
    try:
        return session.start_turn(text, batch)
    except BaseException:
        session.messages = before  # refused: the chat is as it was
        raise
