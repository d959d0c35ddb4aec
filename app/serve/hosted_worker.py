"""One loaded model's worker, whose turns ``app.serve.hosting.ModelHost`` takes among other models'.

A ``BatchWorker`` runs its own loop (``run``); serving several models on the one
engine thread needs the loop's body one turn at a time, and a wake event that
any model's request sets. ``run`` still works alone.
"""

from __future__ import annotations

import threading

from mlxcore.batching.handle import RequestFailedError
from mlxcore.batching.worker import BatchWorker

IDLE, PAUSED, STEPPED = "idle", "paused", "stepped"  # what a turn did


class HostedWorker(BatchWorker):
    """A ``BatchWorker`` whose turns ``ModelHost`` takes among other models' (``run`` still works alone)."""

    _failed_steps = 0

    def share_wake(self, event: threading.Event) -> None:
        """Wake ``event`` (the host's) on a submission: one thread waits for every model's requests."""
        self._wake = event

    def turn(self) -> str:
        """Take in what arrived, then one step if a request is in: IDLE, PAUSED (every reply waits for its
        reader) or STEPPED. Raises what stops the engine, once every request has been told."""
        try:
            self._drain()
            if not self.runner.busy:
                self._snapshot()
                return IDLE
            self._failed_steps = self._step(self._failed_steps)
            self._snapshot()
            return PAUSED if self.runner.paused else STEPPED
        except BaseException as error:  # as BatchWorker._loop: whatever killed the engine, requests hear it
            self._failure = error
            self.stop(error)
            raise

    def settle(self) -> bool:
        """Take in what arrived; whether nothing is queued or running (on the engine thread)."""
        self._drain()
        return not self.runner.busy

    def stop(self, error: BaseException | None = None) -> None:
        """Refuse new requests; those in flight (none, when unloading an idle model) fail with ``error``."""
        self.close()
        error = error or RequestFailedError("The engine was stopped.")
        self.runner.fail_all(error)
        self._fail_inbox(error)
        self._snapshot()
