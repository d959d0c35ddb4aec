"""Snapshot tests (pytest-textual-snapshot) of the main screens; greedy replies, no timings on screen.

Update after an intended change of the look: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest

from app.tui.screens.help import HelpScreen
from app.tui.widgets import status_line
from app.tui.screens.settings import SettingsScreen
from mlxcore.launch import ModelChoice, open_engine
from sessions.chat_session import ChatSession
from sessions.messages import Message
from sessions.store import SessionStore
from test_tui_helpers import DRAFT, SIZE, TARGET, make_app, wait_for, wait_ready

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def store_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))


@pytest.fixture(autouse=True)
def no_figures(monkeypatch):
    """No timings, speeds, ages or memory on screen: the pictures must not depend on them."""
    monkeypatch.setattr(status_line, "SHOW_FIGURES", False)


def steady_cursors(app) -> None:
    """Text cursors stop blinking (shown where focused): the picture must not depend on when it is taken."""
    for screen in app.screen_stack:
        for widget in screen.query("Input, TextArea"):
            widget.cursor_blink = False


CHAT = (
    ("user", "How do I reverse a list in Python?"),
    ("assistant", "<think>\nThe user wants a reversed list. Slicing makes a copy; reverse() works in place.\n"
                  "</think>\n\nUse slicing, which returns a new list:\n\n```python\nnumbers = [1, 2, 3]\n"
                  "print(numbers[::-1])  # [3, 2, 1]\n```\n\nOr call `numbers.reverse()` to reverse it "
                  "**in place**."),
)


def test_chat_with_reply_and_thinking(snap_compare):
    """A finished reply with its thinking block expanded and a highlighted code block.

    The chat is given, not generated, so the picture does not change when the embedded models are retrained
    (the Pilot tests check generated replies against ChatSession).
    """
    app = make_app(messages=CHAT)

    async def run_before(pilot):
        await wait_ready(pilot, app)
        await pilot.press("ctrl+b")  # the sidebar hidden, as a user hides it
        await wait_for(pilot, lambda: len(app.chat.records) == 2, what="the chat")
        await pilot.press("f6")  # expand the thinking blocks
        steady_cursors(app)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def store_two_chats() -> None:
    """Two stored chats with fixed titles (written through the session store, as autosave does)."""
    engine = open_engine(ModelChoice(TARGET, DRAFT)).engine
    for first, reply in (("Plan a weekend in Lisbon", "Start at Belém."), ("How do I reverse a list?", "Slice.")):
        session = ChatSession(engine)
        session.messages = [Message("user", first), Message("assistant", reply)]
        SessionStore().save(session)


def test_sessions_sidebar(snap_compare):
    store_two_chats()
    app = make_app()

    async def run_before(pilot):
        await wait_ready(pilot, app)
        await wait_for(pilot, lambda: app.query_one("#session-list").option_count == 2, what="two rows")
        app.query_one("#session-list").focus()
        steady_cursors(app)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_settings_screen(snap_compare):
    app = make_app(system="You are terse.")

    async def run_before(pilot):
        await wait_ready(pilot, app)
        await pilot.press("ctrl+b")  # the sidebar hidden, as a user hides it
        await pilot.press("f10")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), what="the settings")
        steady_cursors(app)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_help_screen(snap_compare):
    app = make_app()

    async def run_before(pilot):
        await wait_ready(pilot, app)
        await pilot.press("ctrl+b")  # the sidebar hidden, as a user hides it
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        steady_cursors(app)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
