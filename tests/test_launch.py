"""Opening an engine tells the user when the kernel warm-up is slow, and only then."""

from __future__ import annotations

import time

from mlxcore import launch


class _Engine:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def warm_up(self) -> None:
        time.sleep(self.seconds)


def test_slow_warm_up_is_announced(monkeypatch):
    monkeypatch.setattr(launch, "SLOW_WARM_UP_S", 0.05)
    told: list[str] = []
    launch.warm_up(_Engine(0.5), told.append)
    assert told == [launch.SLOW_WARM_UP_NOTE]


def test_quick_warm_up_says_nothing(monkeypatch):
    monkeypatch.setattr(launch, "SLOW_WARM_UP_S", 0.5)
    told: list[str] = []
    launch.warm_up(_Engine(0.0), told.append)
    time.sleep(0.7)  # the timer would have fired by now had it not been cancelled
    assert told == []
