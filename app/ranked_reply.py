"""One `ask` reply run alike on every rank: its progress watched, rank 0's ctrl+c taken at the same token.

In one process both are no-ops: ctrl+c raises where it lands and the turn keeps
what it has. Over several ranks (``mlxcore.distributed``) a rank gone silent
stops the others (``Watchdog``), and ctrl+c on rank 0 stops every rank at the
same prefill chunk or token (``SharedInterrupt``), so the turn is kept and saved
as in one process; the command then exits as interrupted. A lost rank ends the
process where it is noticed (``fail_fast``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from mlxcore import exit_on_lost_peer
from mlxcore import SharedInterrupt
from mlxcore import Watchdog
from mlxcore import StopPrefill

if TYPE_CHECKING:
    from mlxcore import World


class RankedReply:
    def __init__(self, world: World) -> None:
        self.world = world
        self.watchdog = Watchdog(world)
        self.interrupt = SharedInterrupt(world)

    @contextmanager
    def running(self) -> Iterator[None]:
        with self.watchdog.armed(), self.interrupt.catching():
            yield

    def on_prefill(self, done: int, total: int) -> None:
        """Between prefill chunks (``ChatSession.prefill_progress``; inside ``events``' step)."""
        self.watchdog.beat()
        if self.interrupt.requested():
            raise StopPrefill

    def events(self, events: Iterable) -> Iterator:
        """``events``, until rank 0's ctrl+c (then every rank ends after the same one); in one process, as
        they come (the watchdog and the shared ctrl+c are no-ops there)."""
        if not self.world.distributed:
            return iter(events)
        return self._ranked(iter(events))

    def _ranked(self, events: Iterator) -> Iterator:
        with exit_on_lost_peer(self.world):  # each step of the reply, and each check (yield passes no error in)
            while True:
                event = next(events, None)
                if event is None:
                    return
                self.watchdog.beat()
                yield event
                if self.interrupt.requested():
                    return

    @property
    def interrupted(self) -> bool:
        return self.interrupt.stopped
