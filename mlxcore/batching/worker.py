"""Runs the batching scheduler's steps on one thread; other threads submit requests and read their events.

All MLX work happens on the thread that calls ``run()``: the thread that loaded
the models, normally the main thread. MLX streams and ``mx.compile``'s caches
are per thread, and on Linux a thread other than the main one that compiled
MLX graphs makes the process abort at exit ("terminate called without an
active exception", mlx 0.32.4: ml-explore/mlx#3126), so the engine stays on the
main thread and the other side (an HTTP server, a UI) runs on threads of its own.

Other threads talk to the engine through an inbox drained between steps: new
requests, cancellations, and ``call(fn)`` (anything else that needs the engine,
such as saving a session). A step that raises ends the requests it ran (each
with the error; what one request alone raised ends that request alone, in the
runner) and the loop goes on. Only ``MAX_FAILED_STEPS`` failing steps in a row
(or an error that is not an ``Exception``) mean the engine cannot go on: then
every request in flight fails with ``RequestFailedError``, ``alive`` turns False
and new submissions are refused, so a server never holds a live socket on a
dead engine.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from mlxcore.batching.errors import OverloadedError
from mlxcore.batching.handle import RequestFailedError, RequestHandle
from mlxcore.batching.policies import make_policy
from mlxcore.batching.request import Request
from mlxcore.batching.runner import STALL_SECONDS, BatchRunner
from mlxcore.batching.stats import WorkerStats
from mlxcore.engine import Engine

T = TypeVar("T")
IDLE_WAIT_SECONDS = 0.5  # an idle worker wakes this often even when nothing arrives
PAUSED_WAIT_SECONDS = 0.02  # every running reply waits for its reader: look again this soon
MAX_FAILED_STEPS = 3  # steps failing in a row, with no step between that worked: the engine is broken
IDLE, PAUSED, STEPPED = "idle", "paused", "stepped"  # what a turn did
log = logging.getLogger("mlxchat.engine")


class BatchWorker:
    """See the module docstring."""

    def __init__(self, engine: Engine, *, policy: str = "fcfs", max_waiting: int = 64, max_running: int = 8,
                 step_tokens: int | None = None, stall_seconds: float = STALL_SECONDS) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.runner = BatchRunner(engine, make_policy(policy), step_tokens=step_tokens, max_running=max_running,
                                  stall_seconds=stall_seconds)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._stats = WorkerStats()
        self._pending = 0  # submissions posted and not yet taken in by the engine thread
        self._lock = threading.Lock()
        self._failed_steps = 0  # steps failing in a row so far

    # lifecycle ----------------------------------------------------------------

    def run(self) -> None:
        """Run steps on this thread until ``close()``; returns then, or raises what killed the engine
        (after every request in flight has been told)."""
        self._loop()

    def close(self) -> None:
        """Ask ``run()`` to return (from any thread); requests still in flight fail with ``RequestFailedError``."""
        self._stop.set()
        self._wake.set()

    def share_wake(self, event: threading.Event) -> None:
        """Wake ``event`` on a submission: one thread waiting for several workers' requests (serve's models)
        takes their ``turn``s instead of each worker's ``run``."""
        self._wake = event

    @property
    def alive(self) -> bool:
        """Taking requests: ``run()`` is going, or about to be (not closed, not failed)."""
        return not self._stop.is_set() and self._failure is None

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def stats(self) -> WorkerStats:
        return self._stats

    # requests -----------------------------------------------------------------

    def submit(self, request: Request) -> RequestHandle:
        return self.submit_choices(request, 1)[0]

    def submit_choices(self, request: Request, n: int) -> list[RequestHandle]:
        """``n`` replies to ``request``'s prompt, read once (see ``BatchRunner.submit``)."""
        if n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        if not self.alive:
            raise RequestFailedError(f"The engine is not running: {self._failure or 'stopped'}.")
        with self._lock:
            if self._stats.waiting + self._pending >= self.max_waiting:
                raise OverloadedError(f"The server is busy: {self.max_waiting} requests are waiting already.",
                                      retry_after=max(1.0, self._stats.waiting * 0.5))
            self._pending += 1
        handles = [RequestHandle(request.choice(i), self._cancel) for i in range(n)]
        self._post(("submit", request, handles))
        return handles

    def call(self, fn: Callable[[Engine], T], timeout: float | None = None) -> T:
        """Run ``fn(engine)`` on the engine thread between two steps; its result (or its exception)."""
        if not self.alive:
            raise RequestFailedError(f"The engine is not running: {self._failure or 'stopped'}.")
        future: Future[T] = Future()
        self._post(("call", fn, future))
        return future.result(timeout=timeout)

    def cancel_all(self) -> None:
        """Cancel every request queued or running (from any thread): each stream ends with ``"cancelled"``."""
        self._post(("cancel_all",))

    def _cancel(self, handle: RequestHandle) -> None:
        self._post(("cancel", handle.request_id))

    def _post(self, item: tuple) -> None:
        self._inbox.put(item)
        self._wake.set()

    # the engine thread ---------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._turns()
        except BaseException as error:  # whatever killed the engine (Ctrl+C while it waits too): requests hear it
            if self._failure is None:
                self._failure = error
                self.stop(error)
            raise
        self.stop()

    def _turns(self) -> None:
        """Take turns until stopped, waiting while there is nothing to step."""
        while not self._stop.is_set():
            done = self.turn()
            if done != STEPPED:
                self._wake.wait(PAUSED_WAIT_SECONDS if done == PAUSED else IDLE_WAIT_SECONDS)
                self._wake.clear()

    def turn(self) -> str:
        """On the engine thread: take in what arrived, then one step if a request is in. Returns IDLE,
        PAUSED (every reply waits for its reader) or STEPPED; raises what killed the engine, once every
        request in flight has been told."""
        try:
            self._drain()
            if not self.runner.busy:
                self._snapshot()
                return IDLE
            self._failed_steps = self._step(self._failed_steps)
            self._snapshot()
            return PAUSED if self.runner.paused else STEPPED
        except BaseException as error:  # whatever killed the engine, the requests must hear it
            self._failure = error
            self.stop(error)
            raise

    def drained(self) -> bool:
        """On the engine thread: take in what arrived; whether nothing is queued or running."""
        self._drain()
        return not self.runner.busy

    def stop(self, error: BaseException | None = None) -> None:
        """On the engine thread: refuse new requests; those in flight fail with ``error`` (or "stopped")."""
        self._stop.set()
        error = error or RequestFailedError("The engine was stopped.")
        self.runner.fail_all(error)
        self._fail_inbox(error)
        self._snapshot()  # /metrics shows them failed, none running

    def _step(self, failed: int) -> int:
        """One step; a failing one ends the requests it ran. Returns the failing steps in a row so far."""
        try:
            self.runner.step()
            return 0
        except Exception as error:
            if failed + 1 >= MAX_FAILED_STEPS:
                raise
            log.exception("an engine step failed; its requests end with the error and the engine goes on")
            self.runner.fail_running(error)
            return failed + 1

    def _drain(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            kind = item[0]
            if kind == "submit":
                with self._lock:
                    self._pending -= 1
                _, request, handles = item
                try:
                    self.runner.submit(request, handles)
                except Exception as error:  # a prompt the engine refuses: that request's stream says why
                    for handle in handles:
                        handle.fail(error)
            elif kind == "cancel":
                self.runner.cancel(item[1])
            elif kind == "cancel_all":
                for request_id in list(self.runner.sequences):
                    self.runner.cancel(request_id)
            elif kind == "call":
                _, fn, future = item
                try:
                    future.set_result(fn(self.engine))
                except Exception as error:
                    future.set_exception(error)

    def _fail_inbox(self, error: BaseException) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "submit":
                for handle in item[2]:
                    handle.fail(error)
            elif item[0] == "call":
                item[2].set_exception(RequestFailedError(str(error)))

    def _snapshot(self) -> None:
        runner, tally = self.runner, self.runner.tally
        budget = self.engine._kv_budget
        pool = self.engine._pools.get("target")
        manager = pool.manager if pool is not None else None  # counters only: this runs every step
        self._stats = WorkerStats(
            waiting=len({seq.group for seq in runner.scheduler.waiting}), running=len(runner.scheduler.running),
            finished=tally.finished, cancelled=tally.cancelled, failed=tally.failed,
            preemptions=tally.preemptions, late=tally.late, generated_tokens=tally.tokens,
            prompt_tokens=tally.prompt_tokens, prefix_hit_tokens=tally.prefix_hit_tokens,
            tokens_per_second=tally.tokens_per_second, mean_batch_size=tally.mean_batch_size, steps=tally.steps,
            kv_bytes=budget.in_use if budget else 0, kv_budget_bytes=budget.limit if budget else 0,
            pool_used_blocks=manager.used_blocks if manager else 0,
            pool_capacity_blocks=manager.num_blocks if manager else 0)
