"""Running totals of the batching scheduler, and the snapshot the worker hands to other threads."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

RATE_WINDOW_SECONDS = 5.0  # tokens per second over this much recent time


@dataclass
class Tally:
    """Counts kept by the engine thread (``BatchRunner``); ``WorkerStats`` is their snapshot."""

    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    late: int = 0
    preemptions: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0
    steps: int = 0
    decode_steps: int = 0
    batched_sequences: int = 0  # sum over decode steps of the sequences decoded
    largest_batch: int = 0  # the most sequences one decode step decoded
    recent: deque = field(default_factory=deque)  # (time, tokens emitted) of recent steps
    recent_tokens: int = 0  # their sum (read every step for the stats: no sum over the deque)

    def step(self, batch: int, emitted: int, seconds: float) -> None:
        self.steps += 1
        if batch:
            self.decode_steps += 1
            self.batched_sequences += batch
            self.largest_batch = max(self.largest_batch, batch)
        now = time.monotonic()
        self.recent.append((now, emitted))
        self.recent_tokens += emitted
        while self.recent and self.recent[0][0] < now - RATE_WINDOW_SECONDS:
            self.recent_tokens -= self.recent.popleft()[1]

    def prompt(self, tokens: int, hits: int) -> None:
        self.prompt_tokens += tokens
        self.prefix_hit_tokens += hits

    def ended(self, reason: str, late: bool) -> None:
        if reason == "cancelled":
            self.cancelled += 1
        else:
            self.finished += 1
        self.late += late

    @property
    def tokens_per_second(self) -> float:
        if len(self.recent) < 2:
            return 0.0
        span = self.recent[-1][0] - self.recent[0][0]
        return (self.recent_tokens - self.recent[0][1]) / span if span > 0 else 0.0

    @property
    def mean_batch_size(self) -> float:
        return self.batched_sequences / self.decode_steps if self.decode_steps else 0.0
