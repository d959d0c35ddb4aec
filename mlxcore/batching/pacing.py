"""How many prompt tokens a step may read while other sequences decode: about one decode step's worth.

A long prompt that joins running streams is read in chunks, one per step, fed
in the decode pass itself as more rows of the batch (``batch_forward.py``), so
a step is slower by what the chunk adds: its rows in the projections (cheap),
and its attention over its own context, which grows as the prompt is read
(on this CPU ~0.9 ms a layer for 16 tokens at 2,000 keys of the embedded
target, against ~5 ms for a whole decode step of 4 streams).

The chunk size follows what each chunk added to its step, as measured: halved
when that exceeded ``STALL_SHARE`` of a decode step, doubled when it stayed
under ``GROW_BELOW`` of it, between ``MIN_TOKENS`` and ``MAX_TOKENS``. The
running streams then wait about ``1 + STALL_SHARE`` decode steps at most
between two tokens. With nothing decoding, a prompt is read at full speed.
"""

from __future__ import annotations

from dataclasses import dataclass

STALL_SHARE = 0.8  # a chunk may add this share of a decode step's time to its step
GROW_BELOW = 0.35  # a chunk that added less than this share doubles the next one
MIN_TOKENS, MAX_TOKENS, FIRST_TOKENS = 4, 64, 16
WEIGHT = 0.2  # how fast the decode step's average follows new measurements


@dataclass
class Pacing:
    decode_seconds: float | None = None  # a step that only decoded (average)
    size: int = FIRST_TOKENS  # prompt tokens the next chunk may read

    def observe_decode(self, seconds: float) -> None:
        self.decode_seconds = seconds if self.decode_seconds is None else \
            self.decode_seconds + WEIGHT * (seconds - self.decode_seconds)

    def observe_chunk(self, tokens: int, added_seconds: float) -> None:
        """A step read ``tokens`` prompt tokens and took ``added_seconds`` more than a decode step."""
        if self.decode_seconds is None or tokens < self.size:  # a prompt's last, shorter chunk says little
            return
        if added_seconds > STALL_SHARE * self.decode_seconds:
            self.size = max(MIN_TOKENS, self.size // 2)
        elif added_seconds < GROW_BELOW * self.decode_seconds:
            self.size = min(MAX_TOKENS, self.size * 2)

    def cap(self) -> int | None:
        """The most prompt tokens a step may read while others decode; None until a decode step was timed."""
        return None if self.decode_seconds is None else self.size
