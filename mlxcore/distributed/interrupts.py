"""Ctrl+c over several ranks: rank 0 turns it into a decision that every rank takes at the same token.

In one process ctrl+c raises KeyboardInterrupt wherever it lands, and the turn
keeps what it has. Over several ranks that would stop rank 0 alone, mid-step,
and leave the others waiting in a collective. So while a reply runs, rank 0's
ctrl+c only sets a flag (a second one interrupts at once, as usual); at each
token and prefill chunk every rank reads rank 0's flag (``requested``, one small
collective), and all of them stop there together. The others ignore ctrl+c
(``world.leave_interrupts_to_leader``).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from mlxcore.distributed.broadcast import leader_number
from mlxcore.distributed.world import World


class SharedInterrupt:
    """Rank 0's ctrl+c, read by every rank at the same points (a no-op in one process)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.pressed = False  # rank 0: ctrl+c came during ``catching``
        self.stopped = False  # every rank: ``requested`` said yes

    @contextmanager
    def catching(self) -> Iterator[None]:
        """Within, rank 0's first ctrl+c is held for ``requested``; elsewhere, and in one process, nothing."""
        if not (self.world.distributed and self.world.leader):
            yield
            return

        def hold(signum: int, frame: FrameType | None) -> None:
            self.pressed = True
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second press interrupts at once

        previous = signal.signal(signal.SIGINT, hold)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def requested(self) -> bool:
        """Whether rank 0's user pressed ctrl+c (every rank must call this at the same points)."""
        if not self.world.distributed:
            return False
        if leader_number(self.world, 1.0 if self.pressed else 0.0):
            self.stopped = True
        return self.stopped
