"""Driving the engine host in the test's own process: commands go to ``EngineServer.handle``, events are kept."""

from __future__ import annotations

from app.engine_host import protocol as p


class RecordingChannel:
    """A channel that keeps every event sent and has no commands to give (the test calls ``handle`` itself)."""

    def __init__(self) -> None:
        self.sent: list[p.Event] = []

    def send(self, event: p.Event) -> None:
        self.sent.append(event)

    def receive(self, timeout: float | None = None) -> p.Command | None:
        return None
