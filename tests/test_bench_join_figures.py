"""The join row's figures, on traces made by hand: which gaps each one reads, and what it divides by."""

from __future__ import annotations

import pytest

from bench.batching import _reading
from bench.mlx_lm_batch import StreamTrace, stall_figures


def trace(times: list[float]) -> StreamTrace:
    made = StreamTrace()
    for at in times:
        made.add(0, at)
    return made


def test_after_join_step_ratio_reads_the_gaps_once_the_joined_stream_decodes():
    # Steps of 1 s before the join at 10.5, of 3 s while the prompt is read, of 2 s after its first token (20).
    running = [trace([8, 9, 10, 13, 16, 19, 21, 23, 25])]
    joined = trace([20, 22, 24, 26])
    figures = stall_figures(running, joined, joined_at=10.5)
    assert figures["median_step_seconds"] == 1
    assert figures["after_join_step_ratio"] == 2  # the gaps ending at 21, 23 and 25
    assert figures["worst_gap_seconds"] == 3 and figures["join_ttft_seconds"] == 9.5


def test_reading_compares_the_same_tokens_with_nobody_joining():
    # Two streams; the join at 10.5, its first token at 20: the gaps ending at 13, 16 and 19 are the reading's.
    running = [trace([8, 9, 10, 13, 16, 19, 21]), trace([8, 9, 10, 13, 16, 19, 21])]
    quiet = [trace([0, 1, 2, 3, 4.5, 6, 7.5]), trace([0, 1, 2, 3, 4, 5, 6])]
    figures = _reading(running, first=20, joined_at=10.5, quiet=quiet, median_step=1)
    # Reading gaps 3, 3, 3 in both streams; the quiet ones at the same tokens 1, 1.5, 1.5 and 1, 1, 1.
    assert figures["reading_p99_vs_quiet"] == 3 / 1
    assert figures["reading_seconds"] == pytest.approx(((9 - 4) + (9 - 3)) / 2)
    assert figures["no_join_worst_ratio"] == 1.5
