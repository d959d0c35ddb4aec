"""The engine host's replies: every chat's turn on one batching scheduler, run between the UI's commands.

A turn starts with Send, Regenerate, EditLast or ToolResults (``n`` replies side
by side for the first two). The host's loop (``EngineServer.serve``) then
alternates between the UI's commands and ``advance``: one scheduler step for
every turn in progress, whichever chat it belongs to. The chat on screen streams
to the UI; a chat in the background goes on, is kept and autosaved when its
reply ends, and shows it all when it comes back on screen. A single reply is kept
as it ends; alternatives wait for the user's Pick. Stop stops the turn of the
chat on screen only. With a KV cache other than paged, there is no scheduler: a
reply runs to its end before the next command, as ``sync_reply`` does it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from app.engine_host import protocol as p
from app.engine_host.autosave import Autosave
from app.engine_host.channel import SendEvent
from app.engine_host.chats import Chats
from app.engine_host.failure_text import SideBySideError, failure_event
from app.engine_host.model_holder import ModelHolder
from app.engine_host.open_chat import OpenChat
from app.engine_host.publisher import Publisher
from app.engine_host.reply_run import ReplyRun, Turn
from app.engine_host.sync_reply import SyncReply
from app.engine_host.tools import ToolOffer
from mlxcore import MlxchatError

if TYPE_CHECKING:
    from mlxcore import LocalBatch
    from sessions import ChatSession

Batched = Callable[["ChatSession", "LocalBatch", int], Turn]  # starts n replies on the scheduler
Streamed = Callable[["ChatSession"], Iterator[str]]  # one reply, generated as it is read


class Replies:
    """Starts, steps, stops and keeps the turns of every open chat."""

    def __init__(self, send: SendEvent, chats: Chats, model: ModelHolder, autosave: Autosave, publisher: Publisher,
                 tools: ToolOffer, sync: SyncReply) -> None:
        self.send, self.chats, self.model, self.autosave = send, chats, model, autosave
        self.publisher, self.tools, self.sync = publisher, tools, sync
        self._turns = itertools.count(1)
        self._told: p.Generating | None = None

    # commands -----------------------------------------------------------------------------

    def send_message(self, command: p.Send) -> None:
        self._start(command.n, lambda s, batch, n: s.start_turn(command.text, batch, n),
                    lambda s: s.stream(command.text))

    def regenerate(self, command: p.Regenerate) -> None:
        self._start(command.n, lambda s, batch, n: s.start_regenerate(batch, n), lambda s: s.stream_regenerate())

    def edit_last(self, command: p.EditLast) -> None:
        self._start(1, lambda s, batch, n: s.start_edit_last_user(command.text, batch),
                    lambda s: s.stream_edit_last_user(command.text))

    def tool_results(self, command: p.ToolResults) -> None:
        results = command.results
        self._start(1, lambda s, batch, n: s.start_tool_results(results, batch),
                    lambda s: s.stream_tool_results(results))

    def stop(self) -> None:
        chat = self.chats.on_screen
        if chat is not None and chat.run is not None and chat.answering:
            chat.run.stop()

    def pick(self, command: p.Pick) -> None:
        chat = self.chats.screen
        if chat.run is None or chat.run.n == 1:
            raise MlxchatError("There are no replies to pick from.")
        if not 0 <= command.choice < chat.run.n:
            raise MlxchatError(f"There are {chat.run.n} replies: pick one of 1 to {chat.run.n}.")
        self._finish(chat, chat.run, command.choice)

    def _start(self, n: int, batched: Batched, streamed: Streamed) -> None:
        chat = self.chats.idle_screen()
        self.tools.offer(chat.session)
        batch = self.model.batch
        if batch is None and n == 1:
            self.sync.run(chat, streamed(chat.session))
            return
        try:
            if batch is None:
                raise SideBySideError("This chat's KV cache is not paged, and only the paged one generates "
                                      "several replies at once.")
            turn = batched(chat.session, batch, n)
        except Exception:  # refused before any work (too long, no room): the chat is as it was
            self.send(p.Done("error", {}, time.monotonic()))
            self.publisher.publish()
            raise
        run = chat.run = ReplyRun(turn, next(self._turns))
        if not self.autosave.has_file(chat):  # the user's message survives whatever happens to this process
            self.autosave.save(chat)
        self.publisher.publish()
        run.started(self.send)
        self._tell_generating()

    # the scheduler's steps ----------------------------------------------------------------------

    @property
    def stepping(self) -> bool:
        """Some turn is still generating: the loop runs steps between commands."""
        return any(chat.answering for chat in self.chats.all())

    def advance(self) -> None:
        """One scheduler step; then every turn relays what came, and those that ended are finished."""
        answering = [(chat, chat.run) for chat in self.chats.all() if chat.run is not None and chat.answering]
        self.model.step()
        for chat, run in answering:
            run.pump(self.send if chat is self.chats.on_screen else None)
            if not run.generating:
                self._ended(chat, run)

    def _ended(self, chat: OpenChat, run: ReplyRun) -> None:
        """A turn stopped generating: a single reply is kept now; alternatives wait for the user's pick."""
        if run.n == 1:
            self._finish(chat, run, 0)
            return
        self._tell_generating()
        if run.error is not None:
            self._report(chat, run.error)

    def _finish(self, chat: OpenChat, run: ReplyRun, choice: int) -> None:
        """Keep reply ``choice`` of the chat's turn, say so, and autosave the chat."""
        on_screen = chat is self.chats.on_screen
        try:
            run.keep(choice)
        finally:  # whatever happens, the chat is not left waiting for a turn that is over
            chat.run = None
        if on_screen:
            self.send(run.done(choice, self.model.engine.token_limit(), chat.session.cut_in_thinking))  # what fits
        self.autosave.save(chat)
        if on_screen:
            self.publisher.publish()
            self.tools.tell_calls(chat.session, run.ended[choice])
        else:
            self.chats.settle_aside(chat)
        self._tell_generating()
        if run.error is not None and run.n == 1:
            self._report(chat, run.error)

    def _report(self, chat: OpenChat, error: BaseException) -> None:
        if chat is self.chats.on_screen:
            self.send(failure_event(error, loaded=True))
        else:
            self.send(p.Notice(f"“{chat.title}” stopped answering: {error}", "error"))

    def _tell_generating(self) -> None:
        """Tell the UI which stored chats are answering (and which wait for a pick), when that changed."""
        chats = [(chat.session_id, chat.answering) for chat in self.chats.all()
                 if chat.session_id is not None and chat.run is not None]
        told = p.Generating(tuple(sid for sid, answering in chats if answering),
                            tuple(sid for sid, answering in chats if not answering))
        if told != self._told:
            self._told = told
            self.send(told)

    def stop_every_turn(self) -> None:
        """Quitting: every turn stops, and each chat keeps its reply so far (the first of its alternatives)."""
        for chat in self.chats.all():
            if chat.run is not None:
                chat.run.stop()
        for chat in self.chats.all():
            if chat.run is not None:
                self._finish(chat, chat.run, 0)
