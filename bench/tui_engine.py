"""The window's engine as the TUI bench runs it: in its child process at another pace of chunks, or on a
thread of the window's own process (the design the product's child process is measured against).

``ThreadEngineClient`` stands in for ``app.tui.engine_client.EngineClient`` (the bench sets it as a ChatApp's
``client`` before the app runs); ``paced_engine_process`` for ``engine_client.run_engine_process``.
"""

from __future__ import annotations

import queue
import threading
from multiprocessing.connection import Connection

from app.engine_host import protocol as p
from app.engine_host import reply_stream
from app.tui.engine_client import EventHandler, run_engine_process


def paced_engine_process(flush_seconds: float, conn: Connection[p.Event, object], log_path: str) -> None:
    """The engine's child process, sending text to the UI every ``flush_seconds`` (0: every piece)."""
    reply_stream.FLUSH_SECONDS = flush_seconds  # for the life of this process
    run_engine_process(conn, log_path)


class QueueChannel:
    """The engine host's end of two queues (the engine on a thread of the UI's process)."""

    def __init__(self, commands: queue.Queue[p.Command], events: queue.Queue[p.Event]) -> None:
        self.commands, self.events = commands, events

    def send(self, event: p.Event) -> None:
        self.events.put(event)

    def receive(self, timeout: float | None = None) -> p.Command | None:
        try:
            return self.commands.get(timeout=timeout) if timeout != 0 else self.commands.get_nowait()
        except queue.Empty:
            return None


class ThreadEngineClient:
    """EngineClient's interface over an engine host on a thread of this process (it cannot be killed)."""

    def __init__(self, on_event: EventHandler) -> None:
        self.on_event = on_event
        self.log_path = ""  # the engine writes to this process's own output
        self._commands: queue.Queue[p.Command] = queue.Queue()
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        events: queue.Queue[p.Event] = queue.Queue()
        self._commands = queue.Queue()
        self._worker = threading.Thread(target=_serve, args=(QueueChannel(self._commands, events),),
                                        name="mlxchat-engine", daemon=True)
        self._worker.start()
        threading.Thread(target=self._read, args=(self._worker, events), name="mlxchat-events", daemon=True).start()

    def send(self, command: p.Command) -> None:
        self._commands.put(command)

    def shut_down(self) -> None:
        self.send(p.Stop())
        self.send(p.Shutdown())

    def wait(self, timeout: float | None = None) -> bool:
        if self._worker is not None:
            self._worker.join(timeout)
        return not self.alive

    def close(self, timeout: float = 3.0) -> None:
        self.shut_down()
        self.wait(timeout)

    def kill(self) -> None:
        self.close(timeout=0.1)

    @property
    def alive(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def _read(self, worker: threading.Thread, events: queue.Queue[p.Event]) -> None:
        while worker.is_alive() or not events.empty():
            try:
                self.on_event(events.get(timeout=0.2))
            except queue.Empty:
                continue


def _serve(channel: QueueChannel) -> None:
    from app.engine_host.server import EngineServer
    EngineServer(channel).serve()
