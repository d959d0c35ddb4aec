"""Which models are loaded, and the one place routes get the model a request names (``ModelRegistry.use``).

Tensor-free and thread-safe: the routes take models on the event loop, the engine
thread (``app.serve.hosting.ModelHost``) loads, evicts and unloads them. A request
holds a lease on its model from the moment it names it until its request is with
the model's worker, so the engine thread never unloads a model a request is about
to use; after that, the worker's own queue says whether the model is busy.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields, replace

from app.catalog import Catalog, ModelEntry
from app.serve.errors import APIError
from app.serve.session_jobs import SessionJobs
from app.serve.state import ModelInfo
from app.serve.tokenizing import Tokenizing
from mlxcore import WorkerStats

GAUGES = {"waiting", "running", "tokens_per_second", "pool_used_blocks", "pool_capacity_blocks"}
SHARED = {"kv_bytes", "kv_budget_bytes", "mean_batch_size"}  # read from the shared budget, or weighted


@dataclass(eq=False)
class ServedModel:
    """A loaded model as the routes see it: its worker (the only way to its Engine) and plain facts."""

    entry: ModelEntry
    worker: object  # a BatchWorker: submit, call, stats, alive
    info: ModelInfo
    tokens: Tokenizing
    sessions: SessionJobs  # saved chats restored into this model's pool (used on the engine thread)
    keep_alive: float | None = None  # seconds without requests before it is unloaded (None: never)
    last_used: float = field(default_factory=time.monotonic)
    leases: int = 0  # requests that named it and are not yet with its worker
    # Replies still being sent (a stream whose tokens are all made may still be on its way): it is not unloaded
    # under one. Weak: a reply whose response never started sending goes with its last reference.
    replies: weakref.WeakSet = field(default_factory=weakref.WeakSet)


class ModelRegistry:
    """Loaded models by id, least recently used first; ``load`` (set by the engine thread's host) loads one."""

    def __init__(self, catalog: Catalog, *, max_models: int = 1, idle_seconds: float | None = None) -> None:
        self.catalog = catalog
        self.max_models = max_models
        self.idle_seconds = idle_seconds  # --idle-unload: a request's keep_alive overrides it for its model
        self.load: Callable[[ModelEntry], object] | None = None  # entry -> Future[ServedModel], leased once
        self.budget = None  # the KV account every loaded model's pools share (a KVBudget), set at the first load
        self._models: OrderedDict[str, ServedModel] = OrderedDict()
        self.waiting: dict[str, int] = {}  # model id -> requests waiting for it to load (event loop only)
        self._retired = WorkerStats()  # the totals of models unloaded since the start (counters stay monotonic)
        self._lock = threading.Lock()

    # the routes' side ---------------------------------------------------------

    @asynccontextmanager
    async def use(self, name: str, keep_alive: float | None = None) -> AsyncIterator[ServedModel]:
        """The model named ``name``, loaded (waiting for it to load, or for room) and leased until the block
        ends: submit its request inside the block. 404 for a name nothing loads. ``keep_alive``: seconds it
        stays loaded once idle (negative: always), else ``--idle-unload``'s."""
        served = self.take(name)
        if served is None:
            entry = await asyncio.to_thread(self.catalog.find, name)  # directory listings: off the event loop
            if entry is None:
                raise not_found(name, self.catalog)
            served = await self._loaded(entry)
        keep_alive = self.idle_seconds if keep_alive is None else keep_alive  # per request, as Ollama's
        served.keep_alive = None if keep_alive is None or keep_alive < 0 else keep_alive
        try:
            yield served
        finally:
            self.give(served)

    async def _loaded(self, entry: ModelEntry) -> ServedModel:
        """Wait for the engine thread to load ``entry`` (or find it loaded), leased for this request."""
        self.waiting[entry.id] = self.waiting.get(entry.id, 0) + 1
        future = None
        try:
            if entry.source == "hub":  # fetched here, off the engine thread: the loaded models' streams go on
                await asyncio.to_thread(fetch, entry)
            future = self.load(entry)
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:  # the client left: a model that loads anyway must not stay leased
            if future is not None:
                future.add_done_callback(lambda f: f.cancelled() or f.exception() or self.give(f.result()))
            raise
        finally:
            self.waiting[entry.id] -= 1
            if not self.waiting[entry.id]:
                del self.waiting[entry.id]

    def take(self, name: str) -> ServedModel | None:
        """The loaded model ``name``, leased (``give`` it back), or None."""
        with self._lock:
            served = self._models.get(name)
            if served is not None:
                served.leases += 1
                served.last_used = time.monotonic()
                self._models.move_to_end(name)
            return served

    def give(self, served: ServedModel) -> None:
        with self._lock:
            served.leases -= 1
            served.last_used = time.monotonic()

    def sending(self, served: ServedModel, reply: object) -> None:
        """``reply`` (leased still: submitted just now) is being sent: ``served`` stays loaded until ``sent``."""
        with self._lock:
            served.replies.add(reply)

    def sent(self, served: ServedModel, reply: object) -> None:
        with self._lock:
            served.replies.discard(reply)
            served.last_used = time.monotonic()  # (its idle time counts from the reply's end)

    def loaded(self) -> list[ServedModel]:
        """Least recently used first."""
        with self._lock:
            return list(self._models.values())

    def get(self, name: str) -> ServedModel | None:
        with self._lock:
            return self._models.get(name)

    def stats(self) -> WorkerStats:
        """The scheduler's figures over every model loaded now and unloaded before; KV from the shared budget."""
        with self._lock:
            every = [s.worker.stats() for s in self._models.values()]
        total = _sum([*every, self._retired], counted=True)
        now = _sum(every, counted=False)
        kv = {"kv_bytes": self.budget.in_use, "kv_budget_bytes": self.budget.limit} if self.budget else {
            name: max((getattr(s, name) for s in every), default=0) for name in ("kv_bytes", "kv_budget_bytes")}
        return replace(total, **{name: getattr(now, name) for name in GAUGES}, **kv)

    def alive(self) -> bool:
        """No loaded model's engine has failed."""
        return all(s.worker.alive for s in self.loaded())

    # the engine thread's side --------------------------------------------------

    def add(self, served: ServedModel) -> None:
        """A model just loaded, leased once for the request that asked for it."""
        with self._lock:
            served.leases += 1
            served.last_used = time.monotonic()
            self._models[served.entry.id] = served

    def remove_if_idle(self, served: ServedModel, idle: Callable[[], bool]) -> bool:
        """Take ``served`` out if no request holds it and ``idle()`` (its worker has nothing queued or running,
        asked under the lock so that no request can take it meanwhile)."""
        with self._lock:
            if served.leases or served.replies or not idle():
                return False
            del self._models[served.entry.id]
            self._retired = _sum([self._retired, served.worker.stats()], counted=True)
            return True

    def touch(self, served: ServedModel) -> None:
        """Busy now: its idle time counts from here."""
        served.last_used = time.monotonic()

    def expired(self, now: float) -> list[ServedModel]:
        """Loaded models idle longer than their keep-alive (the engine thread confirms they are idle)."""
        with self._lock:
            return [s for s in self._models.values() if s.keep_alive is not None and not s.leases and
                    not s.replies and now - s.last_used >= s.keep_alive]


def fetch(entry: ModelEntry) -> None:
    """Download a hub repo into the cache (``--allow-download``); its loading then reads local files."""
    from mlxcore import ModelLoadError
    from mlxcore import download
    try:
        download(entry.choice.model)
    except ModelLoadError as error:
        raise APIError(404, str(error), param="model", code="model_not_found") from None


def _sum(stats: list[WorkerStats], *, counted: bool) -> WorkerStats:
    """Field by field; the mean batch size weighted by steps. ``counted``: counters only (gauges 0)."""
    names = [f.name for f in fields(WorkerStats) if f.name not in SHARED and (f.name in GAUGES) != counted]
    total = {name: sum(getattr(s, name) for s in stats) for name in names}
    steps = sum(s.steps for s in stats)
    mean = sum(s.mean_batch_size * s.steps for s in stats) / steps if steps and counted else 0.0
    return WorkerStats(**total, mean_batch_size=mean)


def not_found(name: str, catalog: Catalog) -> APIError:
    names = ", ".join(repr(e.id) for e in catalog.entries()[:8])
    more = "" if catalog.allow_download else " A hub repo that is not cached loads only with --allow-download."
    return APIError(404, f"The model {name!r} does not exist here; this server loads {names} (see /v1/models).{more}",
                    param="model", code="model_not_found")
