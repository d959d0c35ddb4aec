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
            self._flush()
            return self._release(), "eos"
        if self._detok is not None:
            self._detok.add_token(token)
            if self._append(self._detok.last_segment):
                return self._release(), "stop"
        if self._max_tokens is not None and self.count >= self._max_tokens:
            stopped = self._flush()
            return self._release(), "stop" if stopped else "length"
        if not self._stop:
            return self._release(), None
        held = max((partial_suffix(self.text, stop) for stop in self._stop), default=0)  # may begin a stop string
        return self._release(held=held), None

    def _flush(self) -> bool:
        """The detokenizer's last characters; whether they complete a stop string."""
        if self._detok is None:
            return False
        self._detok.finalize()
        return self._append(self._detok.last_segment)

    def _append(self, delta: str) -> bool:
        """Add ``delta`` to the reply, cut before a stop string (which may span earlier deltas); whether cut."""
        joined = self.text + delta
        if not self._stop:
            self.text = joined
            return False
        hits = [joined.find(s, max(0, len(self.text) - len(s) + 1)) for s in self._stop]
        cut = min((h for h in hits if h >= 0), default=-1)
        self.text = joined if cut < 0 else joined[:cut]
        return cut >= 0

    def _release(self, held: int = 0) -> str:
        end = max(len(self.text) - held, self._shown)
        delta, self._shown = self.text[self._shown:end], end
        return delta
