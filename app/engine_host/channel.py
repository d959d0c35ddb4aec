"""How commands and events travel between the UI and the engine host: the two ends of a Pipe."""

from __future__ import annotations

import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Protocol

from app.engine_host import protocol as p

SendEvent = Callable[[p.Event], None]


class Channel(Protocol):
    """The engine host's end: send events, receive commands."""

    def send(self, event: p.Event) -> None: ...

    def receive(self, timeout: float | None = None) -> p.Command | None:
        """The next command; None when ``timeout`` passes first; Shutdown when the UI is gone."""


class PipeChannel:
    """Over a multiprocessing Connection (the engine in a child process)."""

    def __init__(self, conn: Connection[p.Event, object]) -> None:
        self.conn = conn
        self._lock = threading.Lock()  # downloads report progress from several threads

    def send(self, event: p.Event) -> None:
        with self._lock:
            try:
                self.conn.send(event)
            except (BrokenPipeError, OSError):
                pass  # the UI is gone; the next receive says Shutdown

    def receive(self, timeout: float | None = None) -> p.Command | None:
        try:
            if timeout is not None and not self.conn.poll(timeout):
                return None
            received: object = self.conn.recv()
        except (EOFError, OSError):
            return p.Shutdown()
        if not isinstance(received, p.Command):
            raise TypeError(f"the UI sent {received!r}, which is no command of app.engine_host.protocol")
        return received
