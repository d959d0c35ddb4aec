"""Relay one reply from a ChatSession stream to the UI in batches, and stop it when asked."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

from app.tui.protocol import FLUSH_SECONDS, Chunk, Done
from sessions.thinking import ThinkingSplitter


def relay_reply(chunks: Iterator[str], send: Callable[[Any], None], stop_asked: Callable[[], bool],
                flush_seconds: float = FLUSH_SECONDS) -> float:
    """Send ``chunks`` as batched Chunk events until they end or ``stop_asked()``; return the last send time.

    ``stop_asked`` is asked after every piece. Closing the iterator keeps the
    partial reply, as ChatSession defines.
    """
    splitter = ThinkingSplitter()
    thinking, answer, raw = [], [], []
    last_flush = time.monotonic()
    try:
        for text in chunks:
            t, a = splitter.feed(text)
            thinking.append(t)
            answer.append(a)
            raw.append(text)
            now = time.monotonic()
            if now - last_flush >= flush_seconds:
                send(Chunk("".join(thinking), "".join(answer), len(thinking), "".join(raw)))
                thinking.clear()
                answer.clear()
                raw.clear()
                last_flush = now
            if stop_asked():
                break
    finally:
        close = getattr(chunks, "close", None)
        if close:
            close()
    t, a = splitter.finish()
    send(Chunk("".join(thinking) + t, "".join(answer) + a, len(thinking), "".join(raw)))
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
    reason = "error" if failed else data.get("finish_reason", "stopped")
    if cut_in_thinking and not failed:
        reason = "cut while thinking"
    return Done(finish_reason=reason, stats=data, last_token_time=last_token_time)

