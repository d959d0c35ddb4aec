"""The UI's handle on the engine host: start it in a child process, send commands, receive events.

The engine runs in a child process ('spawn'): generation then never competes with
rendering for the GIL, a crash in model code cannot take the UI down, and a
download is cancelled by ending the process. (bench/tui.py measures the choice
against a thread of the UI process, with a client of its own.)
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from app.engine_host import protocol as p
from app.engine_host.channel import PipeChannel

EventHandler = Callable[[p.Event], object]  # (what it returns is ignored)


def run_engine_process(conn: Connection[p.Event, object], log_path: str) -> None:
    """The child process: stdout/stderr to a log (the terminal belongs to the UI), then serve until the UI goes."""
    with open(log_path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    from app.engine_host.lifeline import watch_parent
    from app.engine_host.server import EngineServer
    server = EngineServer(PipeChannel(conn))
    watch_parent(server.inbox.ui_gone, server.autosave.saving)
    server.serve()


class EngineClient:
    """Starts the engine host and relays its events to ``on_event`` (called on a reader thread)."""

    def __init__(self, on_event: EventHandler) -> None:
        self.on_event = on_event
        self.log_path = os.path.join(tempfile.gettempdir(), f"mlxchat-engine-{os.getpid()}.log")
        self._closing = False
        self._process: BaseProcess | None = None
        self._conn: Connection[p.Command, object] | None = None

    def start(self) -> None:
        """Start the engine host (it waits for an Open command)."""
        self._closing = False
        context = multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe()
        process = self._process = context.Process(target=run_engine_process, args=(child_end, self.log_path),
                                                  name="mlxchat-engine", daemon=True)
        # Textual replaces sys.stderr with a capture whose fileno() multiprocessing cannot pass on.
        captured, sys.stderr = sys.stderr, sys.__stderr__
        try:
            process.start()
        finally:
            sys.stderr = captured
        child_end.close()
        threading.Thread(target=self._read, args=(self._conn, process), name="mlxchat-events", daemon=True).start()

    def send(self, command: p.Command) -> None:
        """Queue a command for the engine host."""
        if self._conn is None:
            return
        try:
            self._conn.send(command)
        except (BrokenPipeError, OSError):
            self._gone()

    def shut_down(self) -> None:
        """Ask the host to stop the reply, save the chat and exit (``wait`` for it)."""
        self._closing = True
        self.send(p.Stop())
        self.send(p.Shutdown())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the host to end; False if it is still running after ``timeout`` seconds."""
        if self._process is not None:
            self._process.join(timeout)
        return not self.alive

    def close(self, timeout: float = 3.0) -> None:
        """Stop the host: politely (Stop, Shutdown), then by force if it does not end in ``timeout``."""
        self.shut_down()
        if self._process is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(1.0)

    def kill(self) -> None:
        """End the host at once (cancels a download)."""
        self._closing = True
        if self._process is not None:
            self._process.kill()
            self._process.join(2.0)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def _read(self, conn: Connection[p.Command, object], process: BaseProcess) -> None:
        while True:
            try:
                event = conn.recv()
            except (EOFError, OSError):
                if process is self._process:  # not an engine replaced by a restart
                    self._gone()
                return
            if not isinstance(event, p.Event):
                raise TypeError(f"the engine sent {event!r}, which is no event of app.engine_host.protocol")
            self.on_event(event)

    def _gone(self) -> None:
        if self._closing:
            return
        self._closing = True
        code = None
        if self._process is not None:
            self._process.join(1.0)
            code = self._process.exitcode
        self.on_event(p.EngineGone(code, self.log_path))
