"""MessageView streaming: a closed thinking block renders nothing until it is opened or the reply ends."""

from __future__ import annotations

import asyncio

from textual.app import App
from textual.widgets import Markdown

from app.tui.widgets.message_view import MessageView
from test_tui_helpers import wait_for


class OneMessage(App):
    def compose(self):
        yield MessageView("assistant", streaming=True)


def run_on_view(steps):
    """Run ``steps(pilot, view, thinking_markdown)`` in a one-message app; return what it returns."""
    async def scenario():
        app = OneMessage()
        async with app.run_test() as pilot:
            view = app.query_one(MessageView)
            return await steps(pilot, view, view.query_one(".thinking-text", Markdown))
    return asyncio.run(scenario())


def test_closed_thinking_waits_open_thinking_streams_and_finish_shows_all():
    async def steps(pilot, view, thinking):
        await view.append("First I add", "")
        await pilot.pause()
        closed = thinking.source
        view.set_thinking_expanded(True)
        await wait_for(pilot, lambda: thinking.source == "First I add", what="the opened thinking")
        await view.append(" the ones.", "")
        await wait_for(pilot, lambda: thinking.source == "First I add the ones.", what="more thinking")
        await view.append("\n", "The sum is 9.")
        await view.finish()
        await pilot.pause()
        answer = view.query_one(".answer", Markdown).source
        return closed, thinking.source, answer, view.content, str(view.query_one(".thinking").title)
    closed, shown_thinking, shown_answer, content, title = run_on_view(steps)
    assert closed == ""
    assert (shown_thinking, shown_answer) == ("First I add the ones.", "The sum is 9.")
    assert content == "<think>First I add the ones.\n</think>\n\nThe sum is 9."
    assert title == "Thought for 5 words"


def test_thinking_that_stays_closed_is_shown_once_the_reply_ends():
    async def steps(pilot, view, thinking):
        for piece in ("Count ", "the ", "letters."):
            await view.append(piece, "")
        await pilot.pause()
        during = thinking.source
        await view.append("", "Six.")
        await view.finish()
        view.set_thinking_expanded(True)
        await pilot.pause()
        return during, thinking.source
    during, after = run_on_view(steps)
    assert during == "" and after == "Count the letters."
