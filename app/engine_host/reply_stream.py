"""Relay replies to the UI in batches: split into thinking and answer, sent a few times a second."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

from app.engine_host.protocol import FLUSH_SECONDS, Chunk, Done, ReplySoFar
from sessions.thinking import ThinkingSplitter


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


def relay_reply(chunks: Iterator[str], send: Callable[[Any], None], stop_asked: Callable[[], bool],
                flush_seconds: float = FLUSH_SECONDS) -> float:
    """Send ``chunks`` as batched Chunk events until they end or ``stop_asked()``; return the last send time.

    ``stop_asked`` is asked after every piece. Closing the iterator keeps the
    partial reply, as ChatSession defines.
    """
    relay = ReplyRelay()
    last_flush = time.monotonic()
    try:
        for text in chunks:
            relay.add(text)
            now = time.monotonic()
            if now - last_flush >= flush_seconds:
                send(relay.take())
                last_flush = now
            if stop_asked():
                break
    finally:
        close = getattr(chunks, "close", None)
        if close:
            close()
    send(relay.take(final=True))
    return time.monotonic()


def stats_dict(stats: Any, context_length: int | None) -> dict[str, Any]:
    """GenerationStats as plain data for the UI, with the derived rates."""
    if stats is None:
        return {}
    return asdict(stats) | {"prefill_tps": stats.prefill_tps, "decode_tps": stats.decode_tps,
                            "acceptance": stats.acceptance, "context_length": context_length}


def done_event(stats: Any, context_length: int | None, last_token_time: float, failed: bool = False,
               cut_in_thinking: bool = False) -> Done:
    """The Done event for a reply; ``failed`` when it ended with an error (its stats are then not shown).

    ``cut_in_thinking``: the reply stopped inside its think block (it has no answer): the reason says so.
    """
    data = {} if failed else stats_dict(stats, context_length)
    if data.get("finish_reason") == "cancelled":  # the scheduler's word for a reply the user stopped
        data["finish_reason"] = "stopped"
    reason = "error" if failed else data.get("finish_reason", "stopped")
    if cut_in_thinking and not failed:
        reason = "cut while thinking"
    return Done(finish_reason=reason, stats=data, last_token_time=last_token_time)

