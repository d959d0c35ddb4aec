"""The engine thread of `serve`: steps every loaded model's worker, loads models by name, unloads idle ones.

All MLX work stays on this one thread, the main one (``mlxcore.batching.worker``
says why): each loaded model has its own ``BatchWorker`` (queue, scheduler,
pool), and ``ModelHost.run`` takes a turn of each in order (one scheduler step
of each model that has work). Loading a model happens here too, between turns:
meanwhile the other models' streams pause, and the requests for it wait (a
download, with ``--allow-download``, happens before, on a helper thread).

Every model's pools take from one KV account (``KVBudget``), so the models loaded
together never hold more than the budget, and one model's cached prefixes give
way when another needs the room. Unloading a model gives its pools' bytes back to
the account, drops the Engine and empties MLX's buffer cache, on this thread.
"""

from __future__ import annotations

import gc
import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from app.catalog import ModelEntry
from app.serve.errors import APIError
from app.serve.registry import ModelRegistry, ServedModel
from mlxcore import IDLE, IDLE_WAIT_SECONDS, PAUSED_WAIT_SECONDS, STEPPED
from mlxcore import MlxchatError
from mlxcore import format_bytes

log = logging.getLogger("mlxchat.serve")


class ModelHost:
    """See the module docstring. ``open_model(entry, budget)`` loads a model (on this thread) into a
    ``ServedModel`` whose pools take from ``budget`` (None: the first model's own, which is then shared)."""

    def __init__(self, registry: ModelRegistry, open_model: Callable[[ModelEntry, object], ServedModel]) -> None:
        self.registry = registry
        self._open_model = open_model
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._orders: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: list[tuple[ModelEntry, Future]] = []  # loads waiting for a model to become idle
        self._unloaded: dict[str, tuple[float, list[str]]] = {}  # model id -> when it was unloaded, its chats
        registry.load = self.load

    # any thread ------------------------------------------------------------------

    def load(self, entry: ModelEntry) -> Future:
        """A future of ``entry``'s ServedModel, loaded (or found loaded) and leased once for the caller."""
        future: Future = Future()
        self._orders.put((entry, future))
        self._wake.set()
        return future

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def cancel_all(self) -> None:
        for served in self.registry.loaded():
            served.worker.cancel_all()

    # the engine thread -------------------------------------------------------------

    def add(self, served: ServedModel) -> None:
        """A model loaded before the loop starts (the one the server starts with)."""
        self._adopt(served)
        self.registry.give(served)

    def run(self) -> None:
        """Turns until ``close()``; then every loaded model's requests fail as the server stops."""
        try:
            while not self._stop.is_set():
                self._wake.clear()
                wait = self._turns()
                self._take_orders()
                self._unload_expired()
                if self._waiting:
                    wait = min(wait, PAUSED_WAIT_SECONDS)
                if wait:
                    self._wake.wait(wait)
        finally:
            for served in self.registry.loaded():
                if served.worker.alive:
                    served.worker.stop()
            self._keep_on_disk()
            for _, future in self._waiting:
                if future.set_running_or_notify_cancel():
                    future.set_exception(APIError(503, "The server is shutting down: the model was not loaded.",
                                                  code="server_shutting_down", retry_after=5))

    def _keep_on_disk(self) -> None:
        """The server stops: every loaded model's cached blocks go to the disk tier (``--disk-kv``), so the next
        server reads them back instead of computing them; waits for those writes."""
        for served in self.registry.loaded():
            try:
                served.worker.engine.keep_kv_on_disk()
            except Exception:  # a failed engine: what it held is lost, the others' still go
                log.exception("the KV blocks of %s were not kept on disk", served.entry.id)

    def _turns(self) -> float:
        """A turn of each loaded model; how long the loop may then wait (0: some model has work)."""
        wait = IDLE_WAIT_SECONDS
        for served in self.registry.loaded():
            if not served.worker.alive:
                continue
            try:
                done = served.worker.turn()
            except Exception:  # that model's engine died: /health says 503; the others go on
                log.exception("the engine thread failed for %s; /health now answers 503", served.entry.id)
                continue
            if done != IDLE:
                self.registry.touch(served)
                wait = min(wait, 0.0 if done == STEPPED else PAUSED_WAIT_SECONDS)
        return wait

    def _take_orders(self) -> None:
        while True:
            try:
                self._waiting.append(self._orders.get_nowait())
            except queue.Empty:
                break
        self._waiting = [(entry, future) for entry, future in self._waiting if not self._serve(entry, future)]

    def _serve(self, entry: ModelEntry, future: Future) -> bool:
        """Answer one load order; False while it must wait for a loaded model to become idle."""
        if future.cancelled():  # its request went away while it waited
            return True
        served = self.registry.take(entry.id)
        if served is not None:  # loaded meanwhile (another request asked first)
            self._answer(future, served)
            return True
        if len(self.registry.loaded()) >= self.registry.max_models and not self._evict_one(entry):
            return False
        try:
            served = self._load(entry)
        except (MlxchatError, OSError) as error:
            log.warning("could not load %s: %s", entry.id, error)
            if future.set_running_or_notify_cancel():
                told = without_paths(str(error), entry)
                future.set_exception(APIError(500, f"The model {entry.id!r} could not be loaded: {told}",
                                              param="model", code="model_load_failed"))
            return True
        self._adopt(served)
        self._answer(future, served)
        return True

    def _answer(self, future: Future, served: ServedModel) -> None:
        if future.set_running_or_notify_cancel():
            future.set_result(served)
        else:
            self.registry.give(served)  # its request went away while it loaded

    def _evict_one(self, entry: ModelEntry) -> bool:
        """Unload the least recently used model that is idle; False when every one is busy."""
        for served in self.registry.loaded():
            if self.registry.remove_if_idle(served, self._settled(served)):
                self._unload(served, f"to make room for {entry.id} (--max-models {self.registry.max_models})")
                return True
        return False

    def _unload_expired(self) -> None:
        for served in self.registry.expired(time.monotonic()):
            if self.registry.remove_if_idle(served, self._settled(served)):
                self._unload(served, f"after {served.keep_alive:g} s without requests")

    @staticmethod
    def _settled(served: ServedModel) -> Callable[[], bool]:
        # a model whose engine died serves nothing and runs nothing: it may go (its next request loads it anew)
        return lambda: not served.worker.alive or served.worker.drained()

    def _load(self, entry: ModelEntry) -> ServedModel:
        gone, chats = self._unloaded.pop(entry.id, (None, []))
        again = f" again (unloaded {time.monotonic() - gone:.0f} s ago)" if gone is not None else ""
        log.info("loading %s%s", entry.id, again)
        start = time.monotonic()
        served = self._open_model(entry, self.registry.budget)
        log.info("loaded %s in %.1f s", entry.id, time.monotonic() - start)
        if chats:  # the chats saved or restored before the unload: from the store, not recomputed
            start = time.monotonic()
            tokens = served.sessions.restore_again(served.worker.engine, chats)
            log.info("restored %d saved chats of %s from the store (%d tokens of KV) in %.1f s",
                     len(chats), entry.id, tokens, time.monotonic() - start)
        return served

    def _adopt(self, served: ServedModel) -> None:
        served.worker.share_wake(self._wake)
        if self.registry.budget is None:  # the first model's account: every later model's pools share it
            self.registry.budget = served.worker.engine.kv_budget
        if served.keep_alive is None:
            served.keep_alive = self.registry.idle_seconds
        self.registry.add(served)

    def _unload(self, served: ServedModel, why: str) -> None:
        """Free an idle model (out of the registry already): held chats, KV pools, weights, MLX's cache."""
        import mlx.core as mx

        worker, freed, chats = served.worker, 0, served.sessions.recent
        try:
            served.sessions.close()  # restored chats' blocks back to the pool
            worker.stop()
            freed = worker.engine.release_kv()
        except Exception:  # a failed engine may fail here too: its memory still goes with the references
            log.exception("unloading %s did not end cleanly", served.entry.id)
        served.tokens.close()
        served.worker = worker = None  # the Engine's last references: the weights go with it
        gc.collect()
        mx.clear_cache()
        self._unloaded[served.entry.id] = (time.monotonic(), chats)
        log.info("unloaded %s %s (KV freed: %s)", served.entry.id, why, format_bytes(freed))


PATH = re.compile(r"(?<![\w.])[~/][^\s'\"(),;]+")


def without_paths(text: str, entry: ModelEntry) -> str:
    """``text`` for a client: the model's folder named by the model's name, other paths of this machine by
    their last part (the log keeps them whole)."""
    folders = [str(p) for p in (entry.folder, entry.choice.model) if p and str(p).startswith(("/", "~"))]

    def named(found: re.Match) -> str:
        path = found.group().rstrip(".:")
        for folder in folders:
            if path == folder or path.startswith(folder.rstrip("/") + "/"):
                return entry.id + path[len(folder.rstrip("/")):] + found.group()[len(path):]
        return path.rstrip("/").rsplit("/", 1)[-1] + found.group()[len(path):]
    return PATH.sub(named, text)


class SingleHost:
    """Over several ranks: the one model the server started with, on its worker's own loop (rank 0's
    steps are every rank's: ``mlxcore.distributed.ranked_worker``); other names are refused."""

    def __init__(self, registry: ModelRegistry, served: ServedModel) -> None:
        self.served = served  # registry.budget stays None: the KV figures come from the worker's stats
        registry.add(served)
        registry.give(served)
        registry.load = self.load

    def load(self, entry: ModelEntry) -> Future:
        future: Future = Future()
        future.set_exception(APIError(404, f"Over several ranks this server runs only {self.served.entry.id!r}, "
                                           f"not {entry.id!r}.", param="model", code="model_not_found"))
        return future

    def run(self) -> None:
        self.served.worker.run()

    def close(self) -> None:
        self.served.worker.close()

    def cancel_all(self) -> None:
        self.served.worker.cancel_all()
