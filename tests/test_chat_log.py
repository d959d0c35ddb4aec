"""ChatLog while a long reply streams: messages scrolled well above the bottom are unmounted, and come back."""

from __future__ import annotations

import asyncio

from textual.app import App

from app.tui.app import ChatApp
from app.tui.widgets.chat_log import ChatLog
from bench.tui import earlier_messages

LINE = "A line of the story that goes on for a while, one more sentence each time.\n\n"


class ChatOnly(App):
    CSS_PATH = ChatApp.CSS_PATH  # the TUI's own styles: message heights as in the app

    def compose(self):
        yield ChatLog()


def stream_long_reply(scroll_up_first: bool):
    """Sync 20 messages, stream 60 paragraphs; return (mounted views before, after, first_mounted, log)."""
    async def scenario():
        app = ChatOnly()
        async with app.run_test(size=(80, 24)) as pilot:
            log = app.query_one(ChatLog)
            history = list(earlier_messages(20))
            await log.sync(history)
            await pilot.pause()
            before = len(log.views)
            if scroll_up_first:
                # the reader scrolls up a little (not to the top, which mounts earlier pages)
                log.scroll_to(y=max(log.scroll_y - 3, 1), animate=False)
                log.release_anchor()
                await pilot.pause()
            for _ in range(60):
                await log.stream("", LINE)
                await pilot.pause()
            screen = log.scrollable_content_region.height
            above_reply = sum(v.outer_size.height for v in log.views[:-1])
            after, first = len(log.views), log.first_mounted
            await log.live.finish()
            await log.sync(history + [("assistant", LINE * 60)])
            await pilot.pause()
            shown = [(v.role, v.content) for v in log.views]
            return before, after, first, screen, above_reply, shown, log.records[log.first_mounted:]
    return asyncio.run(scenario())


def test_following_a_long_reply_unmounts_what_is_far_above():
    before, after, first, screen, above_reply, shown, records = stream_long_reply(scroll_up_first=False)
    assert after < before  # earlier messages went away while the reply grew
    assert first == 20 + 1 - after  # bookkeeping: the mounted views are the last ones of the chat
    # the reply alone fills SCREENS screens, so what is left above it is less than one screen
    # (none at all when the last unmounting took everything above the reply)
    assert 0 <= above_reply < screen
    # after the reply, the mounted views still show the chat's last messages in order
    assert [role for role, _ in shown] == [role for role, _ in records]
    assert (shown[-1][0], shown[-1][1].strip()) == ("assistant", (LINE * 60).strip())


def test_a_reader_scrolled_up_keeps_every_message_mounted():
    before, after, first, *_ = stream_long_reply(scroll_up_first=True)
    assert after == before + 1 and first == 20 - before
