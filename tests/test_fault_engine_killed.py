"""Fault: the engine process is killed (SIGKILL) mid-reply, under the real chat window.

The window must say so, keep the partial reply on screen and in the session store,
leave the "generating" state, let ctrl+q quit with status 0, and restart the engine
on the same chat when asked.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from app.engine_host import protocol as p
from app.tui.screens.dialogs import ChoiceDialog
from app.tui.text_parts import split_reply
from app.tui.widgets.message_view import MessageView
from sessions.store import SUFFIX, SessionStore
from test_tui_helpers import SIZE, make_app, send, wait_for, wait_ready

STORY = "Tell me a long story."
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def store_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))


async def kill_engine_mid_reply(pilot, app) -> None:
    await wait_ready(pilot, app)
    app.prompt.load_text(STORY)
    await pilot.press("enter")
    await wait_for(pilot, lambda: app.chat.live is not None and app.chat.live.content, what="the reply's text")
    os.kill(app.client._process.pid, signal.SIGKILL)
    await wait_for(pilot, lambda: isinstance(app.screen, ChoiceDialog), what="the engine-stopped dialog")


def saved_history(path: str) -> list[tuple[str, str]]:
    """The history stored for the chat at ``path`` (a store chat's address: ``SessionStore.path_for``)."""
    address = Path(path)
    store = SessionStore(address.parent)
    return [(m.role, m.content) for m in store.read(address.name.removesuffix(SUFFIX)).history]


def test_engine_killed_mid_reply_keeps_the_reply_and_quits_cleanly():
    async def scenario():
        app = make_app(max_tokens=4000, ignore_eos=True)
        async with app.run_test(size=SIZE) as pilot:
            await kill_engine_mid_reply(pilot, app)
            dialog = app.screen
            view = app.chat.views[-1]
            shown = (view.thinking, view.answer)
            status = str(app.status.render())
            file, generating = app.state.file, app.generating
            await pilot.press("ctrl+q")
        return dialog, shown, status, file, generating, app.return_value
    dialog, shown, status, file, generating, code = asyncio.run(scenario())
    assert dialog.title_text == "The engine stopped" and "SIGKILL" in dialog.message
    assert "saved" in dialog.message and "reply so far" in dialog.message
    assert not generating and "engine stopped" in status
    assert code == 0, "ctrl+q quits with status 0"
    history = saved_history(file)
    assert [role for role, _ in history] == ["user", "assistant"] and history[0][1] == STORY
    thinking, answer = split_reply(history[1][1])
    assert (thinking.strip(), answer.strip()) == (shown[0].strip(), shown[1].strip()) != ("", ""), \
        "the file holds the partial reply that is on screen"


def test_restart_after_the_engine_died_goes_on_with_the_chat():
    async def scenario():
        app = make_app(max_tokens=4000, ignore_eos=True)
        async with app.run_test(size=SIZE) as pilot:
            await kill_engine_mid_reply(pilot, app)
            before = app.state.messages
            await pilot.press("enter")  # the dialog's first button: restart
            await wait_ready(pilot, app)
            await wait_for(pilot, lambda: app.state.messages == before, what="the reopened chat")
            app.client.send(p.Configure(params={"max_tokens": 8}))  # the story was to run on and on
            await send(pilot, app, "Go on.")
            return before, app.state.messages, app.state.file, len(app.query(MessageView))
    before, after, file, views = asyncio.run(scenario())
    assert after[:2] == before and after[2] == ("user", "Go on.") and after[3][0] == "assistant"
    assert saved_history(file) == list(after) and views == 4
