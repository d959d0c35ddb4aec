"""Shared pieces of the TUI tests: the app on the embedded pair, and waiting for what the engine reports."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from app.engine_host.protocol import Chunk, Open
from app.tui import engine_client
from app.tui.app import ChatApp
from engine_pace import every_token_engine_process

TARGET, DRAFT = "mini-target", "mini-draft"  # shipped in assets/models: a missing one fails the tests
SIZE = (110, 34)
BLOCK = 16  # tokens per KV block (--block-size): the batching scheduler shares whole blocks between requests


def open_command(max_tokens: int = 48, ignore_eos: bool = False, **changes) -> Open:
    """Greedy, short replies on the embedded pair (``ignore_eos``: each runs to ``max_tokens``)."""
    params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": ignore_eos} | changes.pop("params", {})
    return Open(**({"model": TARGET, "draft": DRAFT, "params": params} | changes))


def make_app(**open_changes) -> ChatApp:
    """A ChatApp on the embedded pair, its engine in a child process as users run it."""
    return ChatApp(open_command(**open_changes))


def send_every_token(monkeypatch) -> None:
    """The apps made from now on in the test: their engine sends each piece of text as its own Chunk."""
    monkeypatch.setattr(engine_client, "run_engine_process", every_token_engine_process)


class EventGate:
    """The UI stops reading the engine's events after the one ``hold_after(events so far)`` accepts, until
    ``release()``; events then go on in order.

    The engine process runs on until the pipe between them is full, then waits on it as it would for a
    slow UI. So a test can act mid-reply on a machine of any speed: with ``send_every_token`` (an event per
    token) a reply longer than the pipe holds (a few hundred events on Linux) is still being generated
    when the test releases the gate.
    """

    def __init__(self, app: ChatApp, hold_after: Callable[[list[Any]], bool]) -> None:
        self.events: list[Any] = []
        self.holding = threading.Event()
        self._open = threading.Event()
        self._open.set()
        self._hold_after: Callable[[list[Any]], bool] | None = hold_after
        self._deliver = app.client.on_event
        app.client.on_event = self._receive

    def _receive(self, event: Any) -> None:  # on the client's reader thread: waiting here stops the reading
        self._open.wait()
        self.events.append(event)
        self._deliver(event)
        if self._hold_after is not None and self._hold_after(self.events):
            self._hold_after = None  # once
            self._open.clear()
            self.holding.set()

    def release(self) -> None:
        self._open.set()


def record_notes(app: ChatApp) -> list[str]:
    """Every notification the app shows, kept (Textual drops expired ones, after 5 s on a busy machine)."""
    notes: list[str] = []
    show = app.notify

    def notify(message, *args, **kwargs):
        notes.append(str(message))
        return show(message, *args, **kwargs)
    app.notify = notify
    return notes


def answer_of(events: list[Any]) -> str:
    """The answer text the Chunk events among ``events`` carry."""
    return "".join(event.answer for event in events if isinstance(event, Chunk))


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Let the app run until ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await pilot.pause(0.05)


async def wait_ready(pilot, app: ChatApp) -> None:
    await wait_for(pilot, lambda: app.ready and app.state is not None, what="the model to load")


async def settle(pilot, app: ChatApp, replies: int) -> None:
    """Wait until ``replies`` replies ended and the chat state after the last one arrived."""
    await wait_for(pilot, lambda: app.replies_done >= replies and not app.generating, what="the reply")
    await wait_for(pilot, lambda: app.updates > app.updates_at_done, what="the chat after the reply")
    await pilot.pause()


async def send(pilot, app: ChatApp, text: str) -> None:
    """Type ``text`` in the input, press Enter and wait for the whole reply."""
    done = app.replies_done
    app.prompt.load_text(text)
    await pilot.press("enter")
    await settle(pilot, app, done + 1)



def window_messages(command: Open, questions: tuple[str, ...] | list[str]) -> list:
    """The chat's messages in a window started with ``command`` (its engine in its own process, as the command
    line starts it) after each of ``questions`` was sent and answered."""
    import asyncio

    async def scenario():
        app = ChatApp(command)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            for question in questions:
                await send(pilot, app, question)
            return list(app.state.messages)

    return asyncio.run(scenario())
