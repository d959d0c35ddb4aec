"""Faults met in the chat window, its engine in a child process as users run it: a message longer than the
context, a full disk during autosave, and quitting while the engine is busy writing.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from app.tui.screens.dialogs import ConfirmDialog, ErrorDialog
from sessions.file_header import SavedSession
from sessions.store import SUFFIX, SessionStore
from small_disk import SmallDisk, can_mount
from test_tui_helpers import SIZE, make_app, record_notes, send, wait_for, wait_ready

QUESTION, SECOND = "What is 12 + 7?", "And 3 + 4?"
TOO_LONG = "The quick brown fox jumps over the lazy dog. " * 300  # ~6,300 tokens; the context holds 4,096
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def store_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def saved_chat(path: str) -> SavedSession:
    """What the store holds for the chat at ``path`` (a store chat's address: ``SessionStore.path_for``)."""
    address = Path(path)
    return SessionStore(address.parent).read(address.name.removesuffix(SUFFIX))


def saved_history(path: str) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in saved_chat(path).history]


def test_a_too_long_message_comes_back_to_the_input_and_the_chat_goes_on():
    async def scenario():
        app = make_app(max_tokens=16)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, QUESTION)
            before = app.state.messages
            app.prompt.load_text(TOO_LONG)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the refusal")
            refusal = (app.screen.title_text, app.screen.message, app.prompt.text, app.state.messages)
            await pilot.press("escape")
            app.prompt.clear()
            await send(pilot, app, SECOND)
            return before, refusal, app.state.messages, app.state.file
    before, (title, message, returned, after_refusal), after, file = asyncio.run(scenario())
    assert title == "Cannot send this" and "context" in message
    assert returned == TOO_LONG, "the refused text is back in the input box"
    assert after_refusal == before, "the refused message is not kept"
    assert after[:2] == before and after[2] == ("user", SECOND) and after[3][0] == "assistant"
    assert saved_history(file) == list(after)


@pytest.mark.skipif(not can_mount(), reason="filling a disk needs a tmpfs, which needs root")
def test_a_full_disk_keeps_the_chat_and_the_old_file(tmp_path, monkeypatch):
    disk = SmallDisk(tmp_path / "disk", "tmpfs")
    monkeypatch.setenv("MLXCHAT_HOME", str(disk.folder))

    async def scenario():
        app = make_app(max_tokens=16)
        notes = record_notes(app)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, QUESTION)
            file = app.state.file
            saved = saved_chat(file)
            disk.fill()
            await send(pilot, app, SECOND)
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the save failure")
            failure = (app.screen.title_text, app.screen.message, app.state.save_error, app.state.messages)
            unchanged = saved_chat(file) == saved
            await pilot.press("escape")
            await pilot.press("ctrl+q")  # with an unsaved chat: asks first
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the quit question")
            await pilot.press("n")
            disk.free()
            await send(pilot, app, "And 5 + 5?")  # the next reply tries again
            await wait_for(pilot, lambda: app.state.save_error is None, what="the save")
            return saved_history(file), failure, unchanged, app.state.messages, notes
    try:
        on_disk, (title, message, error, messages), unchanged, after, shown = asyncio.run(scenario())
    finally:
        disk.close()
    assert title == "Chat not saved" and "No space left on device" in message and "ctrl+s" in message
    assert error and len(messages) == 4, "the reply stays in the chat"
    assert unchanged, "the stored chat is intact: history, settings, times and cached tokens"
    assert any("Saved again" in note for note in shown)
    assert after[:4] == messages and len(after) == 6
    assert on_disk == list(after)


def test_quit_waits_for_the_engine_to_save(monkeypatch):
    """ctrl+q mid-reply: the engine stops the reply and saves it; the window waits as long as that takes
    (here the engine is paused on purpose) and says so, instead of killing it."""
    async def scenario():
        app = make_app(max_tokens=4000, ignore_eos=True)
        notes = record_notes(app)
        kills = []
        monkeypatch.setattr(app.client, "kill", lambda: kills.append(True))
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            app.prompt.load_text("Tell me a long story.")  # a new chat: it gets its file as the reply starts
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.chat.live is not None and app.chat.live.content, what="text")
            engine = app.client._process
            os.kill(engine.pid, signal.SIGSTOP)  # a slow save, as on a big chat
            await pilot.press("ctrl+q")
            await wait_for(pilot, lambda: any("Saving the chat" in n for n in notes), what="the note")
            os.kill(engine.pid, signal.SIGCONT)
            file = app.state.file
            await wait_for(pilot, lambda: not engine.is_alive(), what="the engine to end")
        return app.return_value, engine.exitcode, kills, file
    code, engine_code, kills, file = asyncio.run(scenario())
    assert code == 0 and engine_code == 0 and kills == [], "the engine ended by itself, not killed"
    history = saved_history(file)
    assert [role for role, _ in history] == ["user", "assistant"]
    assert history[1][1].strip(), "the reply so far was saved before the engine ended"


def test_a_session_file_open_in_another_window_is_not_written(tmp_path):
    from sessions.store_lock import SessionLock
    path = tmp_path / "chat.mlxchat"

    async def scenario(first: bool):
        app = make_app(max_tokens=16, session_file=str(path))
        async with app.run_test(size=SIZE) as pilot:
            if not first:
                await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the refusal")
                title = app.screen.title_text
                await pilot.press("escape")
            await wait_ready(pilot, app)
            await send(pilot, app, QUESTION)
            return None if first else (title, app.state.file)
    asyncio.run(scenario(first=True))
    saved = path.read_bytes()
    with SessionLock.acquire(path, mark_open=True):  # as a second window holding it would
        title, file = asyncio.run(scenario(first=False))
    assert title == "Chat is open in another window"
    assert path.read_bytes() == saved and file != str(path), "the new chat went to the store instead"
