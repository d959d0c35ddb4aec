"""Shared pieces of the TUI tests: the app on the embedded pair, and waiting for what the engine reports."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from app.tui.app import ChatApp
from app.tui.protocol import Open
from mlxcore.loading import embedded_names

TARGET, DRAFT = "mini-target", "mini-draft"
SIZE = (110, 34)
needs_embedded = pytest.mark.skipif(not {TARGET, DRAFT} <= set(embedded_names()),
                                    reason="the embedded models (assets/models/mini-*) are not there yet")


def open_command(max_tokens: int = 48, **changes) -> Open:
    """Greedy, short replies on the embedded pair."""
    params = {"temperature": 0.0, "max_tokens": max_tokens} | changes.pop("params", {})
    return Open(**({"model": TARGET, "draft": DRAFT, "params": params} | changes))


def make_app(mode: str = "thread", figures: bool = True, sidebar: bool = True, **open_changes) -> ChatApp:
    """A ChatApp on the embedded pair; thread mode unless a test is about the engine process itself."""
    return ChatApp(open_command(**open_changes), engine_mode=mode, show_figures=figures, show_sidebar=sidebar)


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
