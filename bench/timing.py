"""Timing helpers shared by the benchmark rows."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable


def stream_rate(stream: Iterable, is_token: Callable[[object], bool] = lambda _: True) -> tuple[float, int]:
    """Decode tokens per second of ``stream``: (tokens - 1) / time from the first token to the last.

    The first token's latency is prefill, so it is left out; every stream is
    measured the same way, whoever produced it.
    """
    first = last = None
    count = 0
    for item in stream:
        if not is_token(item):
            continue
        last = time.perf_counter()
        first = first or last
        count += 1
    if count < 2:
        raise RuntimeError("a decode rate needs at least two tokens")
    return (count - 1) / (last - first), count


def paired_median(ours: Callable[[], float], theirs: Callable[[], float], runs: int) -> dict:
    """Run ``ours`` and ``theirs`` alternately ``runs`` times; the median of the per-pair ratios."""
    ratios, mine, other = [], [], []
    for i in range(runs):
        pair = (ours, theirs) if i % 2 == 0 else (theirs, ours)  # alternate who goes first
        results = {fn: fn() for fn in pair}
        mine.append(results[ours])
        other.append(results[theirs])
        ratios.append(results[ours] / results[theirs])
    return {"ratio": statistics.median(ratios), "ratios": ratios,
            "ours": statistics.median(mine), "theirs": statistics.median(other)}
