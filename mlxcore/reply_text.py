"""Turns emitted token ids into text deltas, and decides when the reply ends.

Text that might be the start of a stop string is held back until the next
tokens tell: a reply that stops at "</answer>" never shows a caller "</ans"
first. It is released as soon as it cannot be one, and at the reply's end.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from mlxcore.sequences import partial_suffix

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


class ReplyText:
    """Streaming detokenization, end-of-sequence and stop strings for one reply."""

    def __init__(self, tokenizer: TokenizerWrapper | None, eos_ids: Iterable[int], stop: tuple[str, ...], max_tokens: int | None) -> None:
        self._detok = tokenizer.detokenizer if tokenizer is not None else None
        self._eos = set(eos_ids)
        self._stop = stop
        self._max_tokens = max_tokens
        self.count = 0
        self.text = ""  # the reply so far (cut before a stop string)
        self._shown = 0  # characters of ``text`` handed out as deltas

    def add(self, token: int) -> tuple[str, str | None]:
        """Record one emitted token; return (text delta, finish reason or None)."""
        self.count += 1
        if token in self._eos:
            return self._end()[0], "eos"
        delta, stopped = "", False
        if self._detok is not None:
            self._detok.add_token(token)
            delta, stopped = self._grow(self._detok.last_segment)
        if stopped:
            return delta, "stop"
        if self._max_tokens is not None and self.count >= self._max_tokens:
            rest, stopped = self._end()
            return delta + rest, "stop" if stopped else "length"
        return delta, None

    def _end(self) -> tuple[str, bool]:
        """The detokenizer's last characters and all that was held back; whether they complete a stop string."""
        segment = ""
        if self._detok is not None:
            self._detok.finalize()
            segment = self._detok.last_segment
        return self._grow(segment, end=True)

    def _grow(self, segment: str, end: bool = False) -> tuple[str, bool]:
        """Add ``segment`` to the reply, cut before a stop string (which may span earlier segments); the text to
        hand out now, and whether it was cut. The end that may yet begin a stop string is held back, but at the
        reply's ``end`` or after a cut."""
        text, cut, held = self.text + segment, -1, 0
        if self._stop:
            hits = [text.find(s, max(0, len(self.text) - len(s) + 1)) for s in self._stop]
            cut = min((h for h in hits if h >= 0), default=-1)
            if cut >= 0:
                text = text[:cut]
            elif not end:
                held = max(partial_suffix(text, stop) for stop in self._stop)
        self.text = text
        shown = max(len(text) - held, self._shown)
        delta, self._shown = text[self._shown:shown], shown
        return delta, cut >= 0
