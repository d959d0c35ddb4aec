"""How much prompt reading a step may do while other sequences decode: about 0.6 of a decode step's worth.

Prompts that join running streams are read in chunks whose tokens ride in the decode passes through
a few layers a step (``prompt_feed.py``), so a step is slower by what those chunks add. The
amount is counted in token-layers (a chunk's tokens times the layers it goes through in the step).
A layer's cost for a chunk is a fixed part (attention over the prompt read so far) plus a part per
token, so large chunks through few layers a step read a prompt fastest for a given stall.

The pace follows what reading added to a step, against a step that only decoded as many rows (the
nearest batch size measured when that one was not), averaged over the steps at that pace: halved
when that average, or one step alone, is over ``STALL_SHARE`` (twice it) of a decode step; grown
by a quarter (at least one) while it stays under ``GROW_BELOW`` (growing faster overshot). The
running streams then wait about ``1 + STALL_SHARE`` decode steps between two tokens while a long
prompt is read: the share follows from the goal that a stream's gaps stay within twice a decode step
(the pace's own overshoot and the host's noise take the rest), not from a device's timings. A short prompt (``SHORT_PROMPT`` tokens to read, after the blocks found cached) is read in one
step whatever the pace, as a chat's new message or a server request usually is: its first token
comes sooner. A long prompt's last chunk is not: it is paced like the others.
With nothing decoding, prompts are read at full speed.

A decode step reads every token the running rows hold, so it grows as they do, and a long prompt
may take thousands of steps to join. A time taken before the join then counted the rows' own growth
as the reading's, and the pace fell to its floor while the streams grew (an 8,000-token prompt beside
4 streams on the 0.6B twin read under one token a step). So once the rows hold a quarter more tokens
than when their decode step was timed, steps only decode, to time one again (``decode_due``), at
most once in ``REFRESH_STEPS`` steps. Steps are pipelined (a step waits for the previous step's pass), so
the first step after one that read a prompt takes that pass's time, and is not counted as a decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxcore.device_profile import current

STALL_SHARE = 0.6  # a step's prompt reading may add this share of a decode step's time to it
GROW_BELOW = 0.35  # a step whose reading added less than this share grows the pace
GROWTH = 1.25
MIN_WORK, FIRST_WORK = 1, 16  # token-layers a step
SHORT_PROMPT = 64  # prompts with at most this many tokens to read are read in one step (first token sooner)
WEIGHT = 0.2  # how fast a decode step's average follows new measurements
REFRESH_GROWTH = 1.25  # the rows hold this many times the tokens they held when timed: time a decode step again
REFRESH_STEPS = 16  # steps at least from one decode step timed while a prompt is read to the next
TIMING_STEPS = 3  # decode-only steps at most to time one (the first takes the previous pass's time)


@dataclass
class Pacing:
    layers: int  # the model's
    max_tokens: int = field(default_factory=lambda: current().join_chunk)  # a chunk's tokens at most
    work: int = FIRST_WORK  # token-layers a step may feed
    decode: dict[int, float] = field(default_factory=dict)  # rows -> seconds of a step that only decoded (average)
    held: dict[int, int] = field(default_factory=dict)  # rows -> tokens they held when last timed
    added: float | None = None  # what reading added to a step at this pace, as a share of a decode step (average)
    since: int = 0  # steps that read a prompt since a decode step was timed
    timing: int = 0  # decode-only steps left to time a decode step while a prompt is read
    fed: bool = False  # the last step timed read a prompt

    def observe_decode(self, rows: int, seconds: float, held: int = 0) -> None:
        """A step of ``rows`` decode rows holding ``held`` tokens in all only decoded, and took ``seconds``."""
        if self.fed:  # its time was mostly the previous pass's, which read a prompt
            self.fed = False
            return
        known = self.decode.get(rows)
        grown = known is not None and held > REFRESH_GROWTH * self.held.get(rows, 0)
        # A time taken after the rows grew replaces the average: it is a step of another cost.
        self.decode[rows] = seconds if known is None or grown else known + WEIGHT * (seconds - known)
        self.held[rows], self.since, self.timing = held, 0, 0

    def decode_due(self, rows: int, held: int) -> bool:
        """Whether a step of ``rows`` decode rows holding ``held`` tokens should only decode, to time a decode
        step again while a prompt is read: the time known is of another batch size, or of a quarter fewer
        tokens held. Once due, the next few steps are (until one is timed, ``TIMING_STEPS`` at most)."""
        if not self.timing:
            if not self.decode or self.since < REFRESH_STEPS:
                return False
            if rows in self.decode and held <= REFRESH_GROWTH * self.held.get(rows, 0):
                return False
            self.timing, self.since = TIMING_STEPS, 0
        self.timing -= 1
        return True

    def decode_seconds(self, rows: int) -> float | None:
        """A decode-only step of ``rows`` rows, or of the nearest batch size measured; None before any."""
        if not self.decode:
            return None
        return self.decode[min(self.decode, key=lambda measured: (abs(measured - rows), measured))]

    def observe_feed(self, rows: int, work: int, seconds: float) -> None:
        """A step of ``rows`` decode rows also fed ``work`` token-layers, and took ``seconds``."""
        base = self.decode_seconds(rows)
        if base is None or work <= 0:
            return
        self.since, self.fed = self.since + 1, True
        share = (seconds - base) / base
        if 2 * work < self.work:  # a step that fed far less than the pace says little
            return
        self.added = share if self.added is None else self.added + WEIGHT * (share - self.added)
        if self.added > STALL_SHARE or share > 2 * STALL_SHARE:  # over on average, or far over once
            self.work = max(MIN_WORK, self.work // 2)
            self.added = None  # judge the new pace afresh
        elif self.added < GROW_BELOW:
            self.work = min(self.max_tokens * self.layers, max(self.work + 1, int(self.work * GROWTH)))

    def cap(self) -> int | None:
        """Prompt tokens a step may start reading (a short prompt at once, ``SHORT_PROMPT``; a long one's chunk
        is cut to the pace); None until a decode step was timed (nothing is paced before)."""
        return None if not self.decode else self.max_tokens

    def chunk(self, count: int, left: int, started: bool) -> tuple[int, bool]:
        """(tokens, read at once) of the next chunk of a prompt with ``left`` tokens to read, of which the step
        may start ``count``; ``started`` if chunks of it were read before. A short prompt, or a chat's new
        message after its cached history, goes whole through every layer in one step; a long one's chunk
        is as large as the pace allows through one layer, a power of two (each new length compiles anew), and
        never under the profile's ``min_join_chunk``: a smaller chunk costs a layer nearly as much (its
        attention over the prompt read so far, and the operations a chunk takes) for fewer tokens, so the
        prompt took many times the steps and the steps were no shorter."""
        if count == left <= SHORT_PROMPT and not started:
            return left, True
        tokens = max(1, min(count, max(self.work, current().min_join_chunk)))
        return 1 << (tokens.bit_length() - 1), False
