"""Pilot tests of the chat TUI on the embedded models: send, stop, regenerate, sessions, settings, errors."""

from __future__ import annotations

import asyncio
import os

import pytest
from textual.app import App
from textual.widgets import Markdown

from app.engine_host.protocol import Chunk
from app.tui.screens.dialogs import ErrorDialog
from app.tui.screens.settings import SettingsScreen
from app.tui.text_parts import split_reply
from app.tui.widgets.message_view import MessageView
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams
from sessions.chat_session import ChatSession
from sessions.store import SessionStore
from test_tui_helpers import (DRAFT, SIZE, TARGET, EventGate, make_app, send, send_every_token, settle, wait_for,
                               wait_ready)

pytestmark = pytest.mark.slow
QUESTION = "What is 12 + 7?"


@pytest.fixture(autouse=True)
def store_home(tmp_path, monkeypatch):
    """Each test gets its own empty session store."""
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def reference_reply(text: str, max_tokens: int = 48) -> str:
    """What ChatSession itself answers (greedy), headless."""
    engine = open_engine(ModelChoice(TARGET, DRAFT)).engine
    session = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=max_tokens))
    return session.send(text)


def test_reply_streams_in_and_equals_chat_session(monkeypatch):
    """The streamed reply on screen is ChatSession's reply; with no flush interval each piece is sent as it comes."""
    send_every_token(monkeypatch)
    async def scenario():
        app = make_app()
        chunks = []
        original = app._engine_chunk

        async def counting(event):
            chunks.append(event)
            await original(event)
        app._engine_chunk = counting
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await pilot.press(*"Hi")
            app.prompt.load_text(QUESTION)
            await pilot.press("enter")
            await settle(pilot, app, 1)
            view = app.query(MessageView).last()
            shown = (view.query_one(".thinking-text", Markdown).source, view.query_one(".answer", Markdown).source)
            return app.state.messages, view.thinking, view.answer, chunks, shown
    messages, thinking, answer, chunks, shown = asyncio.run(scenario())
    expected = reference_reply(QUESTION)
    assert messages == (("user", QUESTION), ("assistant", expected))
    want_thinking, want_answer = split_reply(expected)
    assert (thinking.strip(), answer.strip()) == (want_thinking.strip(), want_answer.strip())
    assert (shown[0].strip(), shown[1].strip()) == (want_thinking.strip(), want_answer.strip())  # on screen
    assert len(chunks) > 2, "the reply should arrive piece by piece, not at once"
    assert [c.pieces for c in chunks[:-1]] == [1] * (len(chunks) - 1), "one event per piece of text"
    assert chunks[-1].pieces == 0  # the end of the reply: what the thinking splitter still held


def test_escape_stops_the_reply_and_keeps_it(monkeypatch):
    """Escape while the engine is generating (held there by the gate: a 3000-event reply outgrows the pipe)."""
    send_every_token(monkeypatch)
    async def scenario():
        app = make_app(max_tokens=3000, ignore_eos=True)
        gate = EventGate(app, hold_after=lambda events: any(isinstance(e, Chunk) and (e.thinking or e.answer)
                                                            for e in events))
        async with app.run_test(size=SIZE) as pilot:
            try:
                await wait_ready(pilot, app)
                app.prompt.load_text("Tell me a long story.")
                await pilot.press("enter")
                await wait_for(pilot, gate.holding.is_set, what="the first text")
                await wait_for(pilot, lambda: app.chat.live is not None and app.chat.live.content, what="text")
                await pilot.press("escape")
            finally:
                gate.release()
            await settle(pilot, app, 1)
            return app.state.messages, app.status.stats
    messages, stats = asyncio.run(scenario())
    assert stats["finish_reason"] == "stopped"
    assert 0 < stats["generated_tokens"] < 3000
    assert messages[-1][0] == "assistant" and messages[-1][1], "the partial reply is kept"


def test_regenerate_replaces_the_reply_from_the_cache():
    async def scenario():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, QUESTION)
            first = app.state.messages
            await pilot.press("ctrl+r")
            await settle(pilot, app, 2)
            return first, app.state.messages, app.status.stats, len(app.query(MessageView))
    first, second, stats, views = asyncio.run(scenario())
    assert second == first, "greedy: the regenerated reply is the same"
    assert views == 2
    assert stats["reused_tokens"] == stats["prompt_tokens"] - 1, "all the prompt but its last token came from the cache"


def test_save_quit_reopen_and_continue(store_home):
    async def first_run():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, QUESTION)
            await pilot.press("ctrl+s")
            await pilot.press("ctrl+q")
            await wait_for(pilot, lambda: app.return_value is not None, what="the app to quit")
            return app.state.messages, app.state.session_id, app.return_value

    messages, session_id, code = asyncio.run(first_run())
    assert code == 0 and session_id is not None
    assert [info.id for info in SessionStore().list()] == [session_id]

    async def second_run():
        app = make_app(session_id=session_id)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await wait_for(pilot, lambda: app.state.messages == messages, what="the reopened chat")
            shown = len(app.query(MessageView))
            await send(pilot, app, "And 3 + 4?")
            return shown, app.state.messages, app.status.stats
    shown, after, stats = asyncio.run(second_run())
    assert shown == 2
    assert after[:2] == messages and after[2] == ("user", "And 3 + 4?")
    engine = open_engine(ModelChoice(TARGET, DRAFT)).engine
    unbroken = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=48))
    unbroken.send(QUESTION)
    unbroken.send("And 3 + 4?")
    assert after == tuple((m.role, m.content) for m in unbroken.history)
    assert stats["reused_tokens"] == unbroken.last_stats.reused_tokens > 0, \
        "the reopened session reuses its saved cache as much as one that never closed"


def test_switch_sessions_from_the_sidebar():
    async def scenario():
        app = make_app(max_tokens=16)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "First chat")
            first_id = app.state.session_id
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: app.state.session_id is None, what="a new chat")
            await send(pilot, app, "Second chat")
            await wait_for(pilot, lambda: app.query_one("#session-list").option_count == 2, what="two rows")
            await pilot.press("ctrl+b", "ctrl+b")  # hide and show: focuses the list
            listing = app.query_one("#session-list")
            index = [listing.get_option_at_index(i).id for i in range(2)].index(first_id)
            listing.highlighted = index
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.state.session_id == first_id, what="the first chat")
            return app.state.messages, [v.answer for v in app.query(MessageView)]
    messages, shown = asyncio.run(scenario())
    assert messages[0] == ("user", "First chat")
    assert shown[0] == "First chat" and len(shown) == 2


def test_settings_change_max_tokens():
    async def scenario():
        app = make_app(ignore_eos=True)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await pilot.press("ctrl+y")  # (F10 on a Mac laptop needs fn)
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen)
                           and bool(app.screen.query("#set-max_tokens")), what="the settings")
            field = app.screen.query_one("#set-max_tokens")
            field.value = "5"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.state.params["max_tokens"] == 5, what="the new setting")
            await send(pilot, app, QUESTION)
            return app.status.stats
    stats = asyncio.run(scenario())
    assert stats["generated_tokens"] == 5 and stats["finish_reason"] == "length"


def test_corrupted_session_file_shows_a_dialog(tmp_path):
    bad = tmp_path / "broken.mlxchat"
    bad.write_bytes(b"this is not a session file")

    async def scenario():
        app = make_app(session_file=str(bad))
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
            dialog = app.screen
            await pilot.press("enter")
            await wait_ready(pilot, app)
            await send(pilot, app, QUESTION)  # the app goes on with a new chat
            return dialog.title_text, dialog.message, app.state.messages
    title, message, messages = asyncio.run(scenario())
    assert title == "Session file cannot be opened"
    assert str(bad) in message or "broken" in message
    assert len(messages) == 2


@pytest.mark.parametrize("ssh", [False, True], ids=["pbcopy", "over-ssh"])
def test_copy_last_reply_and_code_block(ssh: bool, tmp_path, monkeypatch):
    """On a Mac (a fake pbcopy on PATH), Ctrl+O puts the reply in pbcopy and says so; over SSH it goes to the
    terminal by OSC 52 (pbcopy would fill the remote Mac's clipboard), and the notice says which."""
    from app.tui import clipboard

    pasted = tmp_path / "pasted"
    (tmp_path / "pbcopy").write_text(f"#!/bin/sh\n{{ cat; echo '|'; }} >> {pasted}\n")
    (tmp_path / "pbcopy").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(clipboard, "PLATFORM", "darwin")
    for name in ("SSH_TTY", "SSH_CONNECTION", "SSH_CLIENT"):
        monkeypatch.delenv(name, raising=False)
    if ssh:
        monkeypatch.setenv("SSH_CONNECTION", "127.0.0.1 50000 127.0.0.1 22")
    osc52: list[str] = []
    monkeypatch.setattr(App, "copy_to_clipboard", lambda self, text: osc52.append(text))

    async def scenario():
        app = make_app()
        notices: list[str] = []
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, QUESTION)
            app.notify = lambda message, **_: notices.append(message)
            await pilot.press("ctrl+o")
            copied = app.clipboard
            app.query(MessageView).first().focus()
            await pilot.press("c")  # on a message: copies it
            await pilot.pause()
            return copied, app.state.messages[-1][1], app.clipboard, notices
    copied, reply, message, notices = asyncio.run(scenario())
    answer = split_reply(reply)[1].strip()
    assert copied == answer
    assert message == QUESTION
    if ssh:
        assert osc52 == [answer, QUESTION] and not pasted.exists()
        assert "by OSC 52" in notices[0] and not notices[0].startswith("Copied")
    else:
        assert osc52 == [] and pasted.read_text() == f"{answer}|\n{QUESTION}|\n"  # the reply, then the message
        assert notices[0] == f"Copied the last reply ({len(answer)} characters) with pbcopy."


