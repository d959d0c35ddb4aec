"""A reply generated to its end before the next command: the engine host's path when the KV cache is not paged.

The batching scheduler runs on the paged pool only; with ``--kv rotating`` or
``--kv standard`` the chat on screen answers as it did before there was one: the
session's own stream, relayed in batches, stopped by a Stop read between pieces.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from app.engine_host import protocol as p
from app.engine_host.autosave import Autosave
from app.engine_host.channel import SendEvent
from app.engine_host.inbox import Inbox
from app.engine_host.model_holder import ModelHolder
from app.engine_host.open_chat import OpenChat
from app.engine_host.publisher import Publisher
from app.engine_host.reply_run import PREFILL_EVERY_S
from app.engine_host.reply_stream import done_event, relay_reply
from app.engine_host.tools import ToolOffer


class SyncReply:
    """Runs one reply of the chat on screen to its end, relaying it as it comes."""

    def __init__(self, send: SendEvent, inbox: Inbox, model: ModelHolder, autosave: Autosave, publisher: Publisher,
                 tools: ToolOffer) -> None:
        self.send, self.inbox, self.model = send, inbox, model
        self.autosave, self.publisher, self.tools = autosave, publisher, tools
        self._chat: OpenChat | None = None  # the chat answering
        self._prefill_sent = 0.0

    def run(self, chat: OpenChat, chunks: Iterator[str]) -> None:
        """Relay ``chunks``, ``chat``'s reply as it is generated, then keep and save it."""
        session, self._chat = chat.session, chat
        self.publisher.publish()  # the UI shows the user's message (and drops a replaced reply)
        session.prefill_progress = self._prefill_progress
        last, failed = time.monotonic(), True
        try:
            last = relay_reply(chunks, self.send, self.inbox.stop_asked)
            failed = False
        finally:
            done = done_event(session.last_stats, self.model.engine.context_length, last, failed,
                              cut_in_thinking=session.cut_in_thinking)
            self.send(done)
            self.autosave.save(chat)
            self.publisher.publish()
        self.tools.tell_calls(session, done.finish_reason)

    def _prefill_progress(self, done: int, total: int) -> None:
        """Between prefill chunks: stop when asked, and say how far the prompt is read.

        A chat that has no file yet is saved as prefill starts, so that the user's
        message survives whatever happens to this process during the reply.
        """
        from mlxcore import StopPrefill
        if self.inbox.stop_asked():
            raise StopPrefill
        now = time.monotonic()
        if done == 0:
            self._prefill_sent = 0.0
            if self._chat is not None and not self.autosave.has_file(self._chat):
                self.autosave.save(self._chat)
                self.publisher.publish()
        if now - self._prefill_sent >= PREFILL_EVERY_S:
            self._prefill_sent = now
            self.send(p.Prefill(done, total))
