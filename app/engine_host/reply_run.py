"""One chat's turn on the batching scheduler, as the engine host relays it: one reply, or n side by side.

The engine host runs the scheduler's steps for every chat that has a turn in
progress; after each step it ``pump``s every turn. A turn's text goes to the UI
only while its chat is on screen (``send`` is None otherwise); it is split and
counted all the same, so a chat that comes back on screen shows everything so
far (``so_far``) and streams on from there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from app.engine_host import protocol as p
from app.engine_host.reply_stream import ReplyRelay, done_event
from mlxcore import FinalEvent, TokenEvent

PREFILL_EVERY_S = 0.25  # prompt-reading progress

Send = Callable[[Any], None] | None


class ReplyRun:
    """A ``sessions.batched_turn.BatchedTurn`` and its relays to the UI (see the module docstring)."""

    def __init__(self, turn: Any, number: int, flush_seconds: float) -> None:
        self.turn, self.number, self.flush_seconds = turn, number, flush_seconds
        self.relays = [ReplyRelay(choice) for choice in range(len(turn.handles))]
        self.ended = [""] * len(self.relays)  # each reply's finish reason once it ended
        self.error: BaseException | None = None  # why the turn failed, if it did
        self.last_sent = self._flushed = time.monotonic()
        self._prefill_sent = 0.0

    @property
    def n(self) -> int:
        return len(self.relays)

    @property
    def generating(self) -> bool:
        return not all(self.ended)

    def so_far(self) -> tuple[p.ReplySoFar, ...]:
        return tuple(relay.so_far(ended) for relay, ended in zip(self.relays, self.ended))

    def stop(self) -> None:
        """Stop every reply still generating (they end at the next step; what they have stays)."""
        self.turn.stop()

    # relaying -----------------------------------------------------------------------------

    def pump(self, send: Send) -> None:
        """Take the events that came since the last pump; ``send`` them when the chat is on screen."""
        for choice, event in self.turn.events():
            if isinstance(event, TokenEvent) and event.text:
                self.relays[choice].add(event.text)
                self._flush(send)
            elif isinstance(event, FinalEvent):
                self._end(choice, event.finish_reason, send)
        for choice, failure in enumerate(self.turn.failures):  # a reply whose request failed ends there
            if failure is not None and not self.ended[choice]:
                self.error = failure.__cause__ or failure
                self._end(choice, "error", send)
        self._prefill(send)

    def started(self, send: Send) -> None:
        """The turn was submitted: the UI hears that its prompt is being read (as in a plain reply)."""
        self._prefill(send, force=True)

    def _flush(self, send: Send) -> None:
        now = time.monotonic()
        if now - self._flushed < self.flush_seconds:
            return
        self._flushed = now
        for relay in self.relays:
            if relay.pending:
                self._send(send, relay.take())

    def _end(self, choice: int, reason: str, send: Send) -> None:
        self._send(send, self.relays[choice].take(final=True))
        self.ended[choice] = "stopped" if reason == "cancelled" else reason
        if self.n > 1 and send is not None:
            send(p.ChoiceEnded(choice, self.ended[choice]))

    def _send(self, send: Send, event: Any) -> None:
        if send is not None:
            send(event)
            self.last_sent = time.monotonic()

    def _prefill(self, send: Send, force: bool = False) -> None:
        """While the prompt is read (no token yet), say how far, a few times a second."""
        if send is None or any(self.turn.tokens):
            return
        done, total = self.turn.prompt_progress()
        now = time.monotonic()
        if total and done < total and (force or now - self._prefill_sent >= PREFILL_EVERY_S):
            self._prefill_sent = now
            send(p.Prefill(done, total))

    # the end ------------------------------------------------------------------------------

    def keep(self, choice: int) -> str:
        """Make reply ``choice`` the chat's reply (``BatchedTurn.keep``; a failed one as far as it got)."""
        return self.turn.keep(choice)

    def done(self, choice: int, context_length: int | None, cut_in_thinking: bool) -> p.Done:
        """The Done event of the kept reply ``choice``."""
        final = self.turn.finals[choice]
        stats = final.stats if final is not None else None
        return done_event(stats, context_length, self.last_sent, failed=self.ended[choice] == "error",
                          cut_in_thinking=cut_in_thinking)

