"""Relay replies to the UI in batches: split into thinking and answer, sent a few times a second."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING

from app.engine_host.protocol import Chunk, Done, ReplySoFar
from sessions import ThinkingSplitter

if TYPE_CHECKING:
    from mlxcore import GenerationStats

# Three updates a second: still streams to the eye, and each costs the UI a repaint, often a layout pass
# (UI CPU share 0.09-0.11 of a core on the bench reply, 0.13-0.14 at five a second). Tests and the bench set
# it in the engine's process to send every piece as its own chunk (0).
FLUSH_SECONDS = 1 / 3


class Pacer:
    """Says when the text gathered since the last chunk goes to the UI: once ``FLUSH_SECONDS`` have passed."""

    def __init__(self) -> None:
        self.every = FLUSH_SECONDS  # read now: the value in force when the reply started
        self.last = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.every:
            return False
        self.last = now
        return True


class ReplyRelay:
    """One reply's text on its way to the UI: fed as generated, taken as Chunk events.

    ``so_far`` is what the taken chunks added up to: what a UI that saw them all shows.
    """

    def __init__(self, choice: int = 0) -> None:
        self.choice = choice
        self.splitter = ThinkingSplitter()
        self.thinking: list[str] = []  # fed, not taken yet (one entry per piece fed)
        self.answer: list[str] = []
        self.raw: list[str] = []
        self.taken = ""  # the raw text of the chunks taken so far

    def add(self, text: str) -> None:
        t, a = self.splitter.feed(text)
        self.thinking.append(t)
        self.answer.append(a)
        self.raw.append(text)

    def catch_up(self, text: str) -> None:
        """``text``, the whole reply at its end: what its token events did not carry (a detokenizer's held
        tail) is fed now, so the UI shows what the chat keeps."""
        fed = self.fed
        if len(text) > len(fed) and text.startswith(fed):
            self.add(text[len(fed):])

    @property
    def pending(self) -> bool:
        return bool(self.raw)

    @property
    def fed(self) -> str:
        """Everything fed so far, taken or not."""
        return self.taken + "".join(self.raw)

    def take(self, final: bool = False) -> Chunk:
        """What was fed since the last chunk; ``final``: the reply ended (the splitter lets go of all it held)."""
        t, a = self.splitter.finish() if final else ("", "")
        chunk = Chunk("".join(self.thinking) + t, "".join(self.answer) + a, len(self.thinking), "".join(self.raw),
                      self.choice)
        self.thinking.clear()
        self.answer.clear()
        self.raw.clear()
        self.taken += chunk.raw
        return chunk

    def so_far(self, ended: str = "") -> ReplySoFar:
        return ReplySoFar(self.taken, ended)


def relay_reply(chunks: Iterator[str], send: Callable[[Chunk], None], stop_asked: Callable[[], bool]) -> float:
    """Send ``chunks`` as batched Chunk events until they end or ``stop_asked()``; return the last send time.

    ``stop_asked`` is asked after every piece. Closing the iterator keeps the
    partial reply, as ChatSession defines.
    """
    relay, pacer = ReplyRelay(), Pacer()
    try:
        for text in chunks:
            relay.add(text)
            if pacer.due():
                send(relay.take())
            if stop_asked():
                break
    finally:
        close = getattr(chunks, "close", None)  # a generator: closing it ends the reply where it is
        if close is not None:
            close()
    send(relay.take(final=True))
    return time.monotonic()


def stats_dict(stats: GenerationStats | None, context_length: int | None) -> dict[str, object]:
    """GenerationStats as plain data for the UI, with the derived rates."""
    if stats is None:
        return {}
    derived: dict[str, object] = {"prefill_tps": stats.prefill_tps, "decode_tps": stats.decode_tps,
                                  "acceptance": stats.acceptance, "context_length": context_length}
    return asdict(stats) | derived


def done_event(stats: GenerationStats | None, context_length: int | None, last_token_time: float,
               failed: bool = False, cut_in_thinking: bool = False) -> Done:
    """The Done event for a reply; ``failed`` when it ended with an error (its stats are then not shown).

    ``cut_in_thinking``: the reply stopped inside its think block (it has no answer): the reason says so.
    """
    data = {} if failed else stats_dict(stats, context_length)
    if data.get("finish_reason") == "cancelled":  # the scheduler's word for a reply the user stopped
        data["finish_reason"] = "stopped"
    reason = "error" if failed else str(data.get("finish_reason", "stopped"))
    if cut_in_thinking and not failed:
        reason = "cut while thinking"
    return Done(finish_reason=reason, stats=data, last_token_time=last_token_time)
