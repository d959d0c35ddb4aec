"""The engine host's incoming commands, one at a time; during a reply that runs to its end (no scheduler),
Stop and Shutdown end it and anything else waits its turn."""

from __future__ import annotations

import threading
from collections import deque

from app.engine_host import protocol as p
from app.engine_host.channel import Channel


class Inbox:
    """Commands from the UI, read one at a time, with a way to ask "stop now?" while a reply runs.

    ``ui_gone`` is set from another thread (the parent-process watch) when the UI
    died while the engine was busy; from then on every reply stops and the host shuts down.
    """

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.deferred: deque[p.Command] = deque()  # read while a reply ran; handled after it
        self.ui_gone = threading.Event()

    def next(self, wait: bool = True) -> p.Command | None:
        """The next command to handle; Shutdown once the UI is gone. ``wait``: wait for one, else None when
        none has come (replies in progress get a scheduler step instead)."""
        if self.deferred:
            return self.deferred.popleft()
        if self.ui_gone.is_set():
            return p.Shutdown()
        return self.channel.receive(timeout=None if wait else 0)

    def stop_asked(self) -> bool:
        """True when a reply that runs to its end must stop: the user asked, or the UI is going or gone."""
        if self.ui_gone.is_set():
            return True
        while (command := self.channel.receive(timeout=0)) is not None:
            if isinstance(command, p.Stop):
                return True
            self.deferred.append(command)
            if isinstance(command, p.Shutdown):  # after EOF every receive says Shutdown: stop reading
                return True
        return False
