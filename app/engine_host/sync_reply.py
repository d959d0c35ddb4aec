"""A reply generated to its end before the next command: the engine host's path when the KV cache is not paged.

The batching scheduler runs on the paged pool only; with ``--kv rotating`` or
``--kv standard`` the chat on screen answers as it did before there was one: the
session's own stream, relayed in batches, stopped by a Stop read between pieces.
"""

from __future__ import annotations

import time
from typing import Any

from app.engine_host import protocol as p
from app.engine_host.reply_run import PREFILL_EVERY_S
from app.engine_host.reply_stream import done_event, relay_reply


class SyncReply:
    """Mixed into EngineServer (through ReplyCommands); uses its session, inbox, opened, send, flush_seconds,
    _publish, _autosave, _has_file and _tell_tool_calls."""

    session: Any
    inbox: Any
    opened: Any
    flush_seconds: float
    _prefill_sent = 0.0

    def _reply(self, chunks: Any) -> None:
        self._publish()  # the UI shows the user's message (and drops a replaced reply)
        self.session.prefill_progress = self._prefill_progress
        last, failed = time.monotonic(), True
        try:
            last = relay_reply(chunks, self.send, self.inbox.stop_asked, self.flush_seconds)
            failed = False
        finally:
            done = done_event(self.session.last_stats, self.opened.engine.context_length, last, failed,
                              cut_in_thinking=self.session.cut_in_thinking)
            self.send(done)
            self._autosave()
            self._publish()
        self._tell_tool_calls(self.session, done.finish_reason)

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
