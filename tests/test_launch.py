"""Opening an engine tells the user when the kernel warm-up is slow, and only then."""

from __future__ import annotations

import threading

from mlxcore import launch


class _Engine:
    """A warm-up that lasts until ``until`` is set, or none at all (``until`` None)."""

    def __init__(self, until: threading.Event | None = None) -> None:
        self.until = until

    def warm_up(self) -> None:
        if self.until is not None:
            assert self.until.wait(60), "the warm-up was never announced"


def test_slow_warm_up_is_announced(monkeypatch):
    """The warm-up outlasts the threshold: it ends only once the note was told."""
    monkeypatch.setattr(launch, "SLOW_WARM_UP_S", 0.01)
    told: list[str] = []
    announced = threading.Event()

    def notice(text: str) -> None:
        told.append(text)
        announced.set()
    launch.warm_up(_Engine(until=announced), notice)
    assert told == [launch.SLOW_WARM_UP_NOTE]


def test_quick_warm_up_says_nothing(monkeypatch):
    """The warm-up ends long before the threshold: its timer is cancelled, and its thread ends without a word."""
    monkeypatch.setattr(launch, "SLOW_WARM_UP_S", 3600.0)
    timers: list[threading.Timer] = []

    class Recorded(threading.Timer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            timers.append(self)
    told: list[str] = []
    launch.warm_up(_Engine(), told.append, timer_class=Recorded)
    [timer] = timers
    timer.join(60)  # a timer left running would wait the hour
    assert not timer.is_alive() and told == []
