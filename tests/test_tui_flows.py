"""Pilot tests of the TUI's other paths: long chats, following, actions, downloads and errors."""

from __future__ import annotations

import asyncio

import pytest

from app.tui.app import EngineEvent
from app.engine_host.protocol import Progress
from app.tui.screens.dialogs import ErrorDialog, TextDialog
from app.tui.screens.download import DownloadScreen
from app.tui.widgets.chat_log import WINDOW
from app.tui.widgets.message_view import MessageView
from bench.tui import earlier_messages
from test_tui_helpers import (SIZE, EventGate, answer_of, make_app, record_notes, send, send_every_token, settle,
                               wait_for, wait_ready)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def store_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # exports land here


def test_long_chat_mounts_only_recent_messages_and_pages_back():
    async def scenario():
        app = make_app(messages=earlier_messages(60))
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await wait_for(pilot, lambda: len(app.chat.records) == 60, what="the chat")
            mounted = len(app.query(MessageView))
            await app.chat.show_earlier()
            await pilot.pause()
            return mounted, len(app.query(MessageView)), app.chat.first_mounted
    mounted, after, first = asyncio.run(scenario())
    assert mounted == WINDOW
    assert after > mounted and first == 60 - after


def test_view_follows_only_at_the_bottom(monkeypatch):
    """The reader scrolls up mid-reply (the gate holds the rest of the reply until then): the view stays."""
    send_every_token(monkeypatch)
    async def scenario():
        app = make_app(messages=earlier_messages(16), max_tokens=400, ignore_eos=True, think=False)  # (an answer from the first token)
        gate = EventGate(app, hold_after=lambda events: len(answer_of(events)) > 20)
        async with app.run_test(size=SIZE) as pilot:
            try:
                await wait_ready(pilot, app)
                app.prompt.load_text("Tell me a story.")
                await pilot.press("enter")
                await wait_for(pilot, gate.holding.is_set, what="some text")
                await wait_for(pilot, lambda: app.chat.live is not None and len(app.chat.live.answer) > 20,
                               what="some text on screen")
                # the reader scrolls up (not to the top, which mounts earlier messages above)
                app.chat.scroll_to(y=app.chat.scroll_y // 2, animate=False)
                await pilot.pause()
                held, shown = app.chat.scroll_y, len(app.chat.live.answer)
            finally:
                gate.release()
            await wait_for(pilot, lambda: app.replies_done == 1, what="the end of the reply")
            await pilot.pause()
            after_reply, final = app.chat.scroll_y, len(app.query(MessageView).last().answer)
            await pilot.press("ctrl+end")
            await wait_for(pilot, lambda: app.chat.scroll_y == app.chat.max_scroll_y, what="the bottom")
            return held, shown, after_reply, final, app.chat.scroll_y
    held, shown, after_reply, final, resumed = asyncio.run(scenario())
    assert final > shown, "the reply went on after the reader scrolled up"
    assert 0 < held and after_reply == held, "the view must not move while the reader is scrolled up"
    assert resumed > held


def test_edit_fork_export_and_palette(tmp_path):
    async def scenario():
        app = make_app(max_tokens=24)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "What is 2 + 2?")
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: isinstance(app.screen, TextDialog) and bool(app.screen.query("#dialog-text")),
                           what="the edit dialog")
            app.screen.query_one("#dialog-text").load_text("What is 3 + 3?")
            await pilot.press("ctrl+s")
            await settle(pilot, app, 2)
            edited = app.state.messages
            original_id = app.state.session_id
            await pilot.press("ctrl+f")
            await wait_for(pilot, lambda: app.state.session_id not in (None, original_id), what="the fork")
            forked = app.state
            await pilot.press("f3")
            await wait_for(pilot, lambda: list(tmp_path.glob("*.md")), what="the export")
            await send(pilot, app, "And 1 + 1?")  # the fork goes on from the shared cache
            titles = {command.title for command in app.get_system_commands(app.screen)}
            return edited, forked, app.status.stats, titles
    edited, forked, stats, titles = asyncio.run(scenario())
    assert [m[0] for m in edited] == ["user", "assistant"] and edited[0][1] == "What is 3 + 3?"
    assert forked.messages == edited and forked.title.endswith("(fork)")
    assert stats["reused_tokens"] > 0
    text = next(tmp_path.glob("*.md")).read_text()
    assert "What is 3 + 3?" in text
    assert {"New chat", "Regenerate", "Fork chat", "Export to Markdown", "Settings", "Switch model"} <= titles


def test_download_screen_shows_progress_and_cancel_falls_back_to_embedded():
    async def scenario():
        app = make_app()
        notes = record_notes(app)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            app.ready = False  # as while a hub model downloads
            app.post_message(EngineEvent(Progress(25 * 2**20, 100 * 2**20)))
            await wait_for(pilot, lambda: isinstance(app.screen, DownloadScreen) and bool(app.screen.query("#download-bar")),
                           what="the download screen")
            await pilot.pause()
            bar = app.screen.query_one("#download-bar")
            shown = (bar.progress, bar.total)
            await pilot.press("escape")
            await wait_ready(pilot, app)
            return shown, app.open_command.model, notes
    shown, model, notes = asyncio.run(scenario())
    assert shown == (25 * 2**20, 100 * 2**20)
    assert model == "mini-target"
    assert any("embedded" in note for note in notes)


def test_model_that_fails_to_load_shows_a_dialog_with_quit():
    async def scenario():
        app = make_app(model="no-such-model", draft=None)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
            dialog = app.screen
            await wait_for(pilot, lambda: bool(dialog.query("#quit")), what="the dialog's buttons")
            dialog.query_one("#quit").press()
            await wait_for(pilot, lambda: app.return_value is not None, what="the app to quit")
            return dialog.title_text, dialog.message, app.return_value
    title, message, code = asyncio.run(scenario())
    assert title == "Model cannot be loaded"
    assert "no-such-model" in message and "--model" in message
    assert code == 0


def test_a_reply_ends_where_the_cache_pool_does_then_a_full_pool_is_a_dialog():
    async def scenario():
        app = make_app(kv="paged", max_kv=48, max_tokens=200, ignore_eos=True, draft=None, no_draft=True)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "Tell me a long story.")  # the reply stops at the pool's end: no error
            first = isinstance(app.screen, ErrorDialog)
            app.prompt.load_text("And then?")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
            dialog = app.screen
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.generating, what="the turn to end")
            return first, dialog.title_text, dialog.message
    first, title, message = asyncio.run(scenario())
    assert not first, "the first reply ended at the pool's end, with no error"
    assert title == "Cache memory is full" and "ctrl+n" in message, message


def test_input_newlines_and_history():
    async def scenario():
        app = make_app(max_tokens=8)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await pilot.press("a", "ctrl+j", "b")
            typed = app.prompt.text
            await pilot.press("enter")
            await settle(pilot, app, 1)
            await send(pilot, app, "second")
            await pilot.press("up")
            newest = app.prompt.text
            await pilot.press("up")
            older = app.prompt.text
            await pilot.press("down", "down")
            return typed, newest, older, app.prompt.text, app.state.messages[0]
    typed, newest, older, back, first = asyncio.run(scenario())
    assert typed == "a\nb" and first == ("user", "a\nb")
    assert (newest, older, back) == ("second", "a\nb", "")


def test_the_engine_process_ends_with_the_app():
    async def scenario():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            during = app.client.alive
        return during, app.client.alive  # the app ended without ctrl+q (as a test or an error ends it)
    during, after = asyncio.run(scenario())
    assert during and not after
