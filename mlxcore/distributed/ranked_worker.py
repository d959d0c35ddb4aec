"""The batching worker over several ranks: every rank takes the same steps, rank 0's inbox steers them.

Rank 0 runs the front end (the HTTP server) and a ``RankedWorker``; the other
ranks run one with no front end (``serve_followers``). Each turn of the loop,
rank 0 drains its inbox (new requests, cancellations, stop) and shares it; every
rank then applies it and takes one step. The scheduler's clock readings are rank
0's (``mlxcore.decision_clock``), so every rank admits, paces and preempts alike.
An idle rank 0 still shares an empty inbox every ``HEARTBEAT_SECONDS``: a rank
that went away is noticed within that (the collective fails), and the others stop.
An idle follower sleeps through most of that interval before it joins the next
share: MLX's ring waits by spinning, so a follower that waited inside the
collective would hold a core at 100% for as long as the server sits idle
(measured: 100% of a core; with the nap, see docs/decisions.md). The cost
is the first request after a pause, which waits up to ``FOLLOWER_NAP_SECONDS``.

``call(fn)`` is refused: a function of rank 0's cannot run on the other ranks.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, TypeVar

from mlxcore.batching.handle import RequestHandle
from mlxcore.batching.worker import BatchWorker
from mlxcore.distributed.broadcast import share
from mlxcore.distributed.errors import DistributedError
from mlxcore.distributed.fail_fast import exit_on_lost_peer
from mlxcore.distributed.watchdog import Watchdog

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

    from mlxcore.engine import Engine

T = TypeVar("T")


class WorkerOptions(TypedDict, total=False):
    """``BatchWorker``'s keyword options, passed through."""

    policy: str
    max_waiting: int
    max_running: int
    step_tokens: int | None
    stall_seconds: float

HEARTBEAT_SECONDS = 0.1
FOLLOWER_NAP_SECONDS = 0.09  # rank 0 shares HEARTBEAT_SECONDS after the last share: the follower spins the rest


@dataclass
class Orders:
    """What rank 0's inbox held this turn, in a form every rank can apply."""

    submits: list = field(default_factory=list)  # (Request, number of choices)
    cancels: list = field(default_factory=list)  # request ids
    stop: bool = False


class RankedWorker(BatchWorker):
    """A ``BatchWorker`` whose loop every rank runs in step (see the module docstring)."""

    def __init__(self, engine: Engine, **options: Unpack[WorkerOptions]) -> None:
        super().__init__(engine, **options)
        self.world = engine.world
        self.watchdog = Watchdog(self.world)
        self._handles: dict[str, list[RequestHandle]] = {}  # rank 0: the handles of requests being shared
        # Pausing a reply for its reader is rank 0's view alone (the other ranks' handles have no reader):
        # every rank must step alike, so replies are never paused here.
        self.runner.max_unread = None

    def call(self, fn: Callable[[Engine], T], timeout: float | None = None) -> T:
        raise DistributedError("This needs the engine of one process; it is not available while the model runs "
                               f"over {self.world.size} ranks.")

    def _turns(self) -> None:
        # every turn is a collective: a rank that goes silent or away stops the others
        with self.watchdog.armed(), exit_on_lost_peer(self.world):
            while True:
                if not self.runner.busy and not self._stop.is_set():
                    self._idle()
                orders = share(self.world, self._take_orders)
                if orders.stop:
                    return
                self._apply(orders)
                if self.runner.busy:
                    self.runner.step()
                self._snapshot()
                self.watchdog.beat()

    def _idle(self) -> None:
        if self.world.leader:
            self._wake.wait(HEARTBEAT_SECONDS)
            self._wake.clear()
        else:
            time.sleep(FOLLOWER_NAP_SECONDS)

    def _take_orders(self) -> Orders:
        """Rank 0: empty the inbox into ``Orders`` (its handles kept here, to be given to the runner)."""
        orders = Orders(stop=self._stop.is_set())
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return orders
            if item[0] == "submit":
                with self._lock:
                    self._pending -= 1
                _, request, handles = item
                self._handles[request.request_id] = handles
                orders.submits.append((request, len(handles)))
            elif item[0] == "cancel":
                orders.cancels.append(item[1])

    def _apply(self, orders: Orders) -> None:
        for request, n in orders.submits:
            handles = self._handles.pop(request.request_id, None)
            if handles is None:  # another rank: handles nobody reads (the events are rank 0's to send)
                handles = [RequestHandle(request.choice(i), lambda handle: None) for i in range(n)]
            try:
                self.runner.submit(request, handles)
            except Exception as error:  # a prompt the engine refuses: that request's stream says why
                for handle in handles:
                    handle.fail(error)
        for request_id in orders.cancels:
            self.runner.cancel(request_id)


def serve_followers(engine: Engine, **options: Unpack[WorkerOptions]) -> None:
    """On a rank other than 0: take rank 0's steps until it stops (or a rank goes away: the error propagates)."""
    RankedWorker(engine, **options).run()
