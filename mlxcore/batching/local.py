"""Batching on the caller's own thread: submit requests, then run steps until what you wait for is there.

For code that already runs on the engine's thread (``ChatSession.alternatives``,
benchmarks, tests): no inbox, no second thread. Events wait on each handle as
``BatchWorker`` would deliver them; ``drain`` takes those that are there.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from mlxcore.batching.handle import RequestHandle
from mlxcore.batching.policies import make_policy
from mlxcore.batching.request import Request
from mlxcore.batching.runner import BatchRunner
from mlxcore.events import Event

if TYPE_CHECKING:  # the runner runs on an Engine it is given; Engine.generate runs the runner
    from mlxcore.engine import Engine


class LocalBatch:
    """A ``BatchRunner`` driven step by step by its caller."""

    def __init__(self, engine: Engine, *, max_running: int = 8, step_tokens: int | None = None) -> None:
        self.runner = BatchRunner(engine, make_policy("fcfs"), step_tokens=step_tokens, max_running=max_running)

    def submit(self, request: Request, n: int = 1) -> list[RequestHandle]:
        """``n`` replies to ``request`` (one shares the prompt's blocks with the others)."""
        handles = [RequestHandle(request.choice(i), self._cancel) for i in range(n)]
        self.runner.submit(request, handles)
        return handles

    def _cancel(self, handle: RequestHandle) -> None:
        self.runner.cancel(handle.request_id)

    @property
    def busy(self) -> bool:
        return self.runner.busy

    def step(self) -> None:
        self.runner.step()

    def prompt_progress(self, handle: RequestHandle) -> tuple[int, int]:
        """(prompt tokens in the cache, prompt tokens in all) of a request; (0, 0) once it has ended."""
        read = self.runner.tokens_read(handle.request_id)
        if read is None:
            return 0, 0
        total = len(handle.request.prompt_ids)
        return min(read, total), total

    def run_until(self, done: Callable[[], bool]) -> None:
        """Run steps until ``done()`` (or nothing is left to run)."""
        while not done() and self.runner.busy:
            self.runner.step()


def drain(handle: RequestHandle) -> Iterator[Event]:
    """The events waiting on ``handle`` now, without blocking."""
    try:
        yield from handle.events(timeout=0)
    except queue.Empty:
        return
