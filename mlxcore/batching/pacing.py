"""How much of a prompt a step may read while other sequences decode: about half a decode step's worth.

A long prompt that joins running streams is read in chunks that go through the layers a few at
a time between decode passes (``prompt_feed.py``), so a step is slower by what the feed adds. Its
cost is, per layer, a fixed part (attention over the prompt read so far) and a part per token; so
the cheapest way to read a prompt at a given stall is one layer a step with as large a chunk as
that allows, and more layers a step only once chunks are as large as they go.

The pace is a number of token-layers a step (a chunk's tokens times the layers it goes through in
that step), following what each step's feed added to it, as measured: halved when that exceeded
``STALL_SHARE`` of a decode step, doubled when it stayed under ``GROW_BELOW`` of it. A chunk takes
up to ``MAX_TOKENS`` tokens, the pace's worth for one layer; the layers a step then follow from the
pace. The running streams wait about ``1 + STALL_SHARE`` decode steps at most between two tokens.
With nothing decoding, a prompt is read at full speed.
"""

from __future__ import annotations

from dataclasses import dataclass

STALL_SHARE = 0.5  # a step's feed may add this share of a decode step's time to it
GROW_BELOW = 0.25  # a feed that added less than this share doubles the pace
MIN_WORK, FIRST_WORK = 1, 16  # token-layers a step
GROW_STEP = 4  # the pace grows by a quarter at a time (doubling overshot: steps of twice the share)
MAX_TOKENS = 64  # a chunk's tokens at most (``compiled_forward.MAX_FED_TOKENS``)
WEIGHT = 0.2  # how fast the decode step's average follows new measurements


@dataclass
class Pacing:
    layers: int  # the model's
    decode_seconds: float | None = None  # a step that only decoded (average)
    work: int = FIRST_WORK  # token-layers a step may feed

    def observe_decode(self, seconds: float) -> None:
        self.decode_seconds = seconds if self.decode_seconds is None else \
            self.decode_seconds + WEIGHT * (seconds - self.decode_seconds)

    def observe_feed(self, work: int, added_seconds: float) -> None:
        """A step fed ``work`` token-layers and took ``added_seconds`` more than a decode step."""
        if self.decode_seconds is None or work < self.work:  # a chunk's last layers or last tokens say little
            return
        if added_seconds > STALL_SHARE * self.decode_seconds:
            self.work = max(MIN_WORK, self.work // 2)
        elif added_seconds < GROW_BELOW * self.decode_seconds:
            self.work = min(MAX_TOKENS * self.layers, self.work + max(1, self.work // GROW_STEP))

    def cap(self) -> int | None:
        """The tokens of the next chunk; None until a decode step was timed (nothing is paced before)."""
        return None if self.decode_seconds is None else min(MAX_TOKENS, self.work)

    def layers_for(self, tokens: int) -> int:
        """The layers a chunk of ``tokens`` goes through this step."""
        return max(1, min(self.layers, self.work // tokens))
