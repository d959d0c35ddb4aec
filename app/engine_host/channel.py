"""How commands and events travel between the UI and the engine host: a Pipe or a pair of queues."""

from __future__ import annotations

import queue
import threading
from typing import Any, Protocol

from app.engine_host.protocol import Shutdown


class Channel(Protocol):
    """The engine host's end: send events, receive commands."""

    def send(self, event: Any) -> None: ...

    def receive(self, timeout: float | None = None) -> Any | None:
        """The next command; None when ``timeout`` passes first; Shutdown when the UI is gone."""


class PipeChannel:
    """Over a multiprocessing Connection (the engine in a child process)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._lock = threading.Lock()  # downloads report progress from several threads

    def send(self, event: Any) -> None:
        with self._lock:
            try:
                self.conn.send(event)
            except (BrokenPipeError, OSError):
                pass  # the UI is gone; the next receive says Shutdown

    def receive(self, timeout: float | None = None) -> Any | None:
        try:
            if timeout is not None and not self.conn.poll(timeout):
                return None
            return self.conn.recv()
        except (EOFError, OSError):
            return Shutdown()


class QueueChannel:
    """Over two queues (the engine on a thread in the UI process, as in the thread-vs-process benchmark)."""

    def __init__(self, commands: queue.Queue, events: queue.Queue) -> None:
        self.commands, self.events = commands, events

    def send(self, event: Any) -> None:
        self.events.put(event)

    def receive(self, timeout: float | None = None) -> Any | None:
        try:
            return self.commands.get(timeout=timeout) if timeout != 0 else self.commands.get_nowait()
        except queue.Empty:
            return None
