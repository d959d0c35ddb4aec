"""A rank that stops answering without dying (its Mac asleep, frozen, the cable pulled): the others stop.

A killed rank closes its sockets, and MLX's ring fails at once. A silent one
does not: the ring waits forever. So while work that takes every rank is under
way (``armed``), a thread watches for progress (``beat``: a token, a prefill
chunk, a scheduler turn); when none comes for ``stall_limit()`` seconds it says
why and ends this process, since the thread blocked in the collective cannot be
woken. Outside ``armed`` (loading, waiting for the user's prompt) nothing is
timed: there a rank may wait on another as long as it must.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mlxcore.distributed.fail_fast import stop_now
from mlxcore.distributed.world import World

STALL_ENV = "MLXCHAT_RANK_STALL_S"
DEFAULT_STALL_S = 120.0  # longer than any one step: a prefill chunk of the largest model is seconds


def stall_limit() -> float:
    value = os.environ.get(STALL_ENV, "")
    try:
        return float(value) if value else DEFAULT_STALL_S
    except ValueError:
        return DEFAULT_STALL_S


class Watchdog:
    """Ends the process when an armed stretch of work makes no progress for ``limit`` seconds."""

    def __init__(self, world: World, limit: float | None = None, on_stall: Callable[[str], None] = stop_now,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.world, self.limit, self.on_stall, self.clock = world, limit or stall_limit(), on_stall, clock
        self._armed = 0
        self._last = clock()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Progress: the ranks are still working together."""
        self._last = self.clock()

    @contextmanager
    def armed(self) -> Iterator[None]:
        """Within, a stretch of ``limit`` seconds without a ``beat`` ends the process (several ranks only)."""
        if not self.world.distributed:
            yield
            return
        with self._lock:
            self.beat()
            self._armed += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="mlxchat-rank-watchdog", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._armed -= 1

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.limit / 4))
            silent = self.clock() - self._last
            if self._armed and silent > self.limit:
                self.on_stall(f"rank {self.world.rank} of {self.world.size}: no progress for {silent:.0f} s; another "
                              "rank stopped answering (its machine asleep or frozen, or the link cut). Stopping. "
                              f"({STALL_ENV} sets the limit, now {self.limit:g} s.)")
                return
