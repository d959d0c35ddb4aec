"""The chat window as a process of its own, for tests that kill it: ``python tests/tui_process_helper.py SCENARIO``.

It runs the real ChatApp (headless, driven by Textual's pilot) with its engine in
a child process, as ``mlxchat`` does, on the embedded pair. It prints
``ENGINE <pid>`` once the model is loaded, then plays SCENARIO and prints a
marker at the moment a test should strike, then waits to be killed:

- ``idle``: one short reply, then ``IDLE``.
- ``reply``: a reply of thousands of tokens; ``STREAMING`` after its first text reached the window.
- ``prefill``: a prompt of about 3,000 tokens; ``PREFILLING`` when the engine reports it started reading it.
- ``download``: a hub model, from the hub at ``$HF_ENDPOINT``; ``ENGINE <pid>`` as soon as the engine
  process started (the test knows the download began when its fake hub is asked).

The session store is ``$MLXCHAT_HOME``'s.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from app.tui.app import ChatApp  # noqa: E402
from app.engine_host.protocol import Open  # noqa: E402

LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 140  # ~2,950 tokens with the embedded tokenizer
STORY = "Tell me a long story."
SHORT = "What is 12 + 7?"


def say(marker: str) -> None:
    os.write(1, (marker + "\n").encode())  # not print: Textual captures sys.stdout while the app runs


def make_app(scenario: str) -> ChatApp:
    params = {"temperature": 0.0, "max_tokens": 4000 if scenario == "reply" else 16, "ignore_eos": scenario == "reply"}
    if scenario == "download":
        return ChatApp(Open(model="mlxchat-tests/never-arrives", no_draft=True, params=params))
    app = ChatApp(Open(model="mini-target", draft="mini-draft", params=params))
    _on_first(app, "_engine_chunk", "STREAMING" if scenario == "reply" else None)
    _on_first(app, "_engine_prefill", "PREFILLING" if scenario == "prefill" else None)
    return app


def _on_first(app: ChatApp, handler: str, marker: str | None) -> None:
    """Print ``marker`` once the UI has handled the first event of this kind."""
    if marker is None:
        return
    original = getattr(app, handler)

    async def wrapped(event) -> None:
        await original(event)
        if wrapped.first:
            wrapped.first = False
            say(marker)
    wrapped.first = True
    setattr(app, handler, wrapped)


async def play(scenario: str) -> None:
    app = make_app(scenario)
    async with app.run_test(size=(110, 34)) as pilot:
        if scenario == "download":
            while app.client._process is None:
                await pilot.pause(0.05)
            say(f"ENGINE {app.client._process.pid}")
            await asyncio.Event().wait()
        while not (app.ready and app.state is not None):
            await pilot.pause(0.05)
        say(f"ENGINE {app.client._process.pid}")
        text = {"idle": SHORT, "reply": STORY, "prefill": LONG_PROMPT}[scenario]
        app.prompt.load_text(text)
        await pilot.press("enter")
        if scenario == "idle":
            while app.generating or app.replies_done == 0 or app.updates <= app.updates_at_done:
                await pilot.pause(0.05)
            say("IDLE")
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(play(sys.argv[1]))
