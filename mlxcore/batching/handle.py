"""What a caller gets for a submitted request: its events, readable from any thread or an asyncio loop.

The engine thread puts events in; the caller reads them with ``events()`` (a
blocking iterator) or, in an asyncio loop, with ``RequestHandle.read_all``:
an ``Inbox`` that gathers the events of several handles without blocking the
loop (the engine thread hands each event to it with ``call_soon_threadsafe``).
The stream ends after one ``FinalEvent``; if the engine fails first, reading
raises ``RequestFailedError``. ``cancel()`` may be called from any thread at
any time: the request stops at the next step, its blocks are free after it,
and its stream ends with a ``FinalEvent`` whose finish reason is
``"cancelled"``. ``unread`` counts the events put and not yet read: the runner
pauses a reply whose reader falls behind (``BatchRunner``), so what waits here
stays bounded."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn, cast

from mlxcore.batching.request import Request
from mlxcore.errors import MlxchatError
from mlxcore.events import Event, FinalEvent

if TYPE_CHECKING:
    from mlxcore.caches import Caches


class RequestFailedError(MlxchatError):
    """The engine failed while this request was queued or running."""


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class RequestHandle:
    """The caller's side of one request (see the module docstring)."""

    def __init__(self, request: Request, cancel: Callable[[RequestHandle], None]) -> None:
        self.request = request
        self.request_id = request.request_id
        self._cancel = cancel
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # an ``Inbox``'s, once one reads this handle
        self._inbox: asyncio.Queue[tuple[int, tuple[object, ...]]] | None = None
        self._index = 0  # this handle's place in that inbox
        # Events put and not yet taken by the reader (back-pressure: the runner pauses the reply while this is
        # large); changed under ``_lock``.
        self.unread = 0
        self.finished = threading.Event()  # set once the final event (or a failure) is put
        self.caches: Caches | None = None  # with ``Request.keep_caches``: the reply's caches once it ended (the caller releases them)

    def cancel(self) -> None:
        """Stop generating (no-op once finished); the stream then ends with a ``"cancelled"`` final event."""
        if not self.finished.is_set():
            self._cancel(self)

    # the engine thread's side -------------------------------------------------

    def put(self, *events: Event | _Failure) -> None:
        """Hand ``events`` to the reader, in order, as one arrival: an ``Inbox`` takes a speculative round's
        tokens together (``fail`` hands a failure the same way)."""
        if isinstance(events[-1], FinalEvent):
            self.finished.set()
        with self._lock:
            self.unread += len(events)
            if self._loop is None:
                for event in events:
                    self._queue.put(event)
                return
            loop, inbox, index = self._loop, self._inbox, self._index
        assert inbox is not None  # set with the loop
        try:
            loop.call_soon_threadsafe(inbox.put_nowait, (index, events))
        except RuntimeError:  # the reader's loop is closed: nobody is reading any more
            pass

    def fail(self, error: BaseException) -> None:
        if not self.finished.is_set():
            self.finished.set()
            self.put(_Failure(error))

    # the caller's side --------------------------------------------------------

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """The request's events, blocking; ``queue.Empty`` if none comes within ``timeout`` seconds."""
        while True:
            item = self._queue.get(timeout=timeout)
            yield self._taken(item)
            if isinstance(item, FinalEvent):
                return

    def take(self) -> tuple[list[Event], BaseException | None]:
        """The events waiting now, without blocking, and the error that failed the request after them (or
        None): for a reader on the engine's own thread that takes every event of a step (``Engine.generate``;
        ``drain`` leaves those its caller does not take)."""
        events: list[Event] = []
        with self._lock:
            while not self._queue.empty():
                item = self._queue.get_nowait()
                self.unread -= 1
                if isinstance(item, _Failure):
                    return events, item.error
                events.append(cast(Event, item))  # what ``put`` delivered
        return events, None

    @staticmethod
    def read_all(handles: list[RequestHandle]) -> Inbox:
        """The events of ``handles`` in the running asyncio loop, as they arrive (see ``Inbox``)."""
        return Inbox(handles)

    def _read_into(self, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue[tuple[int, tuple[object, ...]]],
                   index: int) -> None:
        """From now on ``put`` hands events to ``inbox`` in ``loop`` (see ``Inbox``), this one first."""
        with self._lock:
            self._loop, self._inbox, self._index = loop, inbox, index
            while not self._queue.empty():  # what came before this reader arrived
                inbox.put_nowait((index, (self._queue.get_nowait(),)))

    def _taken(self, item: object) -> Event:
        """The event ``item`` is (what ``put`` delivered), now read; ``RequestFailedError`` if the engine failed."""
        with self._lock:
            self.unread -= 1
        if isinstance(item, _Failure):
            raise_failed(item.error)
        return cast(Event, item)


class Inbox:
    """The events of several handles in one asyncio loop: ``for index, events in await inbox.arrived()`` while
    ``inbox.open``, each handle's events in order, with its place in ``handles``. A call takes everything that
    arrived since the last one, so a reader takes a speculative round's tokens (or what came while it was
    busy) at once, and can send them as one chunk. The engine pauses a handle whose events wait here unread
    (``RequestHandle.unread``), so what waits stays bounded. Create it in the loop that reads; a handle is read
    by one inbox (or ``events()``) only."""

    def __init__(self, handles: list[RequestHandle]) -> None:
        self._queue: asyncio.Queue[tuple[int, tuple[object, ...]]] = asyncio.Queue()
        self.handles = handles
        self.open = len(handles)  # the handles whose final event (or failure) was not taken yet
        self._failed: BaseException | None = None  # a failure that came after events still to be read
        loop = asyncio.get_running_loop()
        for index, handle in enumerate(handles):
            handle._read_into(loop, self._queue, index)

    async def arrived(self) -> list[tuple[int, list[Event]]]:
        """The events that arrived since the last call (waiting for one), by handle, now read;
        ``RequestFailedError`` once the engine failed a handle's request (after the events before it)."""
        if self._failed is not None:
            raise_failed(self._failed)
        queue = self._queue
        items = [await queue.get()]
        while not queue.empty():
            items.append(queue.get_nowait())
        grouped: dict[int, list[Event]] = {}
        for index, events in items:
            handle = self.handles[index]
            with handle._lock:
                handle.unread -= len(events)
            for item in events:
                if isinstance(item, _Failure):
                    self._failed = item.error
                    break
                if isinstance(item, FinalEvent):
                    self.open -= 1
                grouped.setdefault(index, []).append(cast(Event, item))  # what ``put`` delivered
            if self._failed is not None:
                break
        if not grouped and self._failed is not None:
            raise_failed(self._failed)
        return list(grouped.items())


def raise_failed(error: BaseException) -> NoReturn:
    """What a reader gets where the engine failed its request with ``error``."""
    raise RequestFailedError(f"The engine failed while generating: {error}") from error
