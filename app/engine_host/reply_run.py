"""One chat's turn on the batching scheduler, as the engine host relays it: one reply, or n side by side.

The engine host runs the scheduler's steps for every chat that has a turn in
progress; after each step it ``pump``s every turn. A turn's text goes to the UI
only while its chat is on screen (``send`` is None otherwise); it is split and
counted all the same, so a chat that comes back on screen shows everything so
far (``so_far``) and streams on from there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from app.engine_host import protocol as p
from app.engine_host.channel import SendEvent
from app.engine_host.reply_stream import Pacer, ReplyRelay, done_event
from mlxcore import FinalEvent, TokenEvent

if TYPE_CHECKING:
    from mlxcore import Event

PREFILL_EVERY_S = 0.25  # prompt-reading progress


class Turn(Protocol):
    """What a ReplyRun uses of a turn on the scheduler (``sessions``' BatchedTurn, from ``ChatSession.start_turn``
    and its kin): per reply, its handle, tokens, final event and failure, in the order of the choices."""

    @property
    def handles(self) -> Sequence[object]: ...

    @property
    def tokens(self) -> Sequence[Sequence[int]]: ...

    @property
    def finals(self) -> Sequence[FinalEvent | None]: ...

    @property
    def failures(self) -> Sequence[BaseException | None]: ...

    def events(self) -> list[tuple[int, Event]]:
        """(choice, event) for the events that came since the last call."""

    def prompt_progress(self) -> tuple[int, int]:
        """(prompt tokens read, prompt tokens in all)."""

    def stop(self) -> None: ...

    def keep(self, choice: int) -> str:
        """Make reply ``choice`` the chat's reply; the others go."""


class ReplyRun:
    """A turn on the scheduler and its relays to the UI (see the module docstring)."""

    def __init__(self, turn: Turn, number: int) -> None:
        self.turn, self.number = turn, number
        self.relays = [ReplyRelay(choice) for choice in range(len(turn.handles))]
        self.ended = [""] * len(self.relays)  # each reply's finish reason once it ended
        self.error: BaseException | None = None  # why the turn failed, if it did
        self.last_sent = time.monotonic()
        self._pacer = Pacer()
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

    def pump(self, send: SendEvent | None) -> None:
        """Take the events that came since the last pump; ``send`` them when the chat is on screen."""
        for choice, event in self.turn.events():
            if isinstance(event, TokenEvent) and event.text:
                self.relays[choice].add(event.text)
                self._flush(send)
            elif isinstance(event, FinalEvent):
                self.relays[choice].catch_up(event.text)
                self._end(choice, event.finish_reason, send)
        for choice, failure in enumerate(self.turn.failures):  # a reply whose request failed ends there
            if failure is not None and not self.ended[choice]:
                self.error = failure.__cause__ or failure
                self._end(choice, "error", send)
        self._prefill(send)

    def started(self, send: SendEvent | None) -> None:
        """The turn was submitted: the UI hears that its prompt is being read (as in a plain reply)."""
        self._prefill(send, force=True)

    def _flush(self, send: SendEvent | None) -> None:
        if not self._pacer.due():
            return
        for relay in self.relays:
            if relay.pending:
                self._send(send, relay.take())

    def _end(self, choice: int, reason: str, send: SendEvent | None) -> None:
        self._send(send, self.relays[choice].take(final=True))
        self.ended[choice] = "stopped" if reason == "cancelled" else reason
        if self.n > 1 and send is not None:
            send(p.ChoiceEnded(choice, self.ended[choice]))

    def _send(self, send: SendEvent | None, event: p.Chunk) -> None:
        if send is not None:
            send(event)
            self.last_sent = time.monotonic()

    def _prefill(self, send: SendEvent | None, force: bool = False) -> None:
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
