"""The scheduler's running figures (``tally.py``) against the same figures counted by hand."""

from __future__ import annotations

from mlxcore.batching import tally as tally_module
from mlxcore.batching.tally import RATE_WINDOW_SECONDS, Tally


def test_tokens_per_second_counts_the_last_window_only(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(tally_module.time, "monotonic", lambda: clock[0])
    tally, steps = Tally(), []
    for i in range(400):
        clock[0] = i * 0.05
        emitted = 1 + i % 8
        steps.append((clock[0], emitted))
        tally.step(8, emitted, 0.05)
        window = [(at, n) for at, n in steps if at >= clock[0] - RATE_WINDOW_SECONDS]
        expected = sum(n for _, n in window[1:]) / (window[-1][0] - window[0][0]) if len(window) > 1 else 0.0
        assert abs(tally.tokens_per_second - expected) < 1e-9 * max(1.0, expected)
