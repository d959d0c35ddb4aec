"""Turns emitted token ids into text deltas, and decides when the reply ends."""

from __future__ import annotations

from collections.abc import Iterable


class ReplyText:
    """Streaming detokenization, end-of-sequence and stop strings for one reply."""

    def __init__(self, tokenizer, eos_ids: Iterable[int], stop: tuple[str, ...], max_tokens: int | None) -> None:
        self._detok = tokenizer.detokenizer if tokenizer is not None else None
        self._eos = set(eos_ids)
        self._stop = stop
        self._max_tokens = max_tokens
        self.count = 0
        self.text = ""

    def add(self, token: int) -> tuple[str, str | None]:
        """Record one emitted token; return (text delta, finish reason or None)."""
        self.count += 1
        if token in self._eos:
            return self._flush(), "eos"
        delta = ""
        if self._detok is not None:
            self._detok.add_token(token)
            delta = self._detok.last_segment
        delta, stopped = self._append(delta)
        if stopped:
            return delta, "stop"
        if self._max_tokens is not None and self.count >= self._max_tokens:
            return delta + self._flush(), "length"
        return delta, None

    def _flush(self) -> str:
        if self._detok is None:
            return ""
        self._detok.finalize()
        tail, _ = self._append(self._detok.last_segment)
        return tail

    def _append(self, delta: str) -> tuple[str, bool]:
        """Add ``delta`` to the reply, cut before a stop string (which may span earlier deltas)."""
        joined = self.text + delta
        hits = [joined.find(s, max(0, len(self.text) - len(s) + 1)) for s in self._stop]
        cut = min((h for h in hits if h >= 0), default=-1)
        if cut < 0:
            self.text = joined
            return delta, False
        shown = len(self.text)
        self.text = joined[:cut]
        return self.text[shown:], True
