"""The UI's handle on the engine host: start it (child process or thread), send commands, receive events.

The default is a child process ('spawn'): generation then never competes with
rendering for the GIL, a crash in model code cannot take the UI down, and a
download is cancelled by ending the process. The thread mode exists to measure
that choice (see bench/tui.py).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from app.engine_host import protocol as p
from app.engine_host.channel import PipeChannel, QueueChannel

EventHandler = Callable[[Any], None]


def run_engine_process(conn: Any, log_path: str) -> None:
    """The child process: stdout/stderr to a log (the terminal belongs to the UI), then serve until the UI goes."""
    with open(log_path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    from app.engine_host.server import EngineServer
    from app.engine_host.lifeline import watch_parent
    server = EngineServer(PipeChannel(conn))
    watch_parent(server.inbox.ui_gone, server.saving)
    server.serve()


def _run_engine_thread(channel: QueueChannel) -> None:
    from app.engine_host.server import EngineServer
    EngineServer(channel).serve()


class EngineClient:
    """Starts the engine host and relays its events to ``on_event`` (called on a reader thread)."""

    def __init__(self, on_event: EventHandler, mode: str = "process") -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"engine mode must be 'process' or 'thread', not {mode!r}")
        self.on_event, self.mode = on_event, mode
        self.log_path = os.path.join(tempfile.gettempdir(), f"mlxchat-engine-{os.getpid()}.log")
        self._closing = False
        self._process: Any = None
        self._conn: Any = None
        self._commands: queue.Queue | None = None
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        """Start the engine host (it waits for an Open command)."""
        self._closing = False
        if self.mode == "process":
            context = multiprocessing.get_context("spawn")
            self._conn, child_end = context.Pipe()
            self._process = context.Process(target=run_engine_process, args=(child_end, self.log_path),
                                            name="mlxchat-engine", daemon=True)
            self._start_process()
            child_end.close()
            reader = threading.Thread(target=self._read_pipe, args=(self._conn, self._process),
                                      name="mlxchat-events", daemon=True)
        else:
            self._commands, events = queue.Queue(), queue.Queue()
            self._worker = threading.Thread(target=_run_engine_thread, args=(QueueChannel(self._commands, events),),
                                            name="mlxchat-engine", daemon=True)
            self._worker.start()
            reader = threading.Thread(target=self._read_queue, args=(events,), name="mlxchat-events", daemon=True)
        reader.start()

    def _start_process(self) -> None:
        # Textual replaces sys.stderr with a capture whose fileno() multiprocessing cannot pass on.
        captured, sys.stderr = sys.stderr, sys.__stderr__
        try:
            self._process.start()
        finally:
            sys.stderr = captured

    def send(self, command: Any) -> None:
        """Queue a command for the engine host."""
        try:
            if self._conn is not None:
                self._conn.send(command)
            elif self._commands is not None:
                self._commands.put(command)
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
        elif self._worker is not None:
            self._worker.join(timeout)
        return not self.alive

    def close(self, timeout: float = 3.0) -> None:
        """Stop the host: politely (Stop, Shutdown), then by force if it does not end in ``timeout``."""
        self.shut_down()
        if self._process is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(1.0)
        elif self._worker is not None:
            self._worker.join(timeout)

    def kill(self) -> None:
        """End the host at once (cancels a download); thread mode cannot, and just closes."""
        self._closing = True
        if self._process is not None:
            self._process.kill()
            self._process.join(2.0)
        else:
            self.close(timeout=0.1)

    @property
    def alive(self) -> bool:
        if self._process is not None:
            return self._process.is_alive()
        return self._worker is not None and self._worker.is_alive()

    def _read_pipe(self, conn: Any, process: Any) -> None:
        while True:
            try:
                event = conn.recv()
            except (EOFError, OSError):
                if process is self._process:  # not an engine replaced by a restart
                    self._gone()
                return
            self.on_event(event)

    def _read_queue(self, events: queue.Queue) -> None:
        while self._worker is not None and (self._worker.is_alive() or not events.empty()):
            try:
                self.on_event(events.get(timeout=0.2))
            except queue.Empty:
                continue

    def _gone(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._process is not None:
            self._process.join(1.0)
        code = self._process.exitcode if self._process is not None else None
        self.on_event(p.EngineGone(code, self.log_path))
