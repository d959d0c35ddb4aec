"""The scrolling list of messages: follows new text at the bottom, mounts only the recent messages.

Only the last WINDOW messages are mounted; older ones come back a page at a
time when the reader scrolls to the top, and are unmounted again once the
reader is back at the bottom. While a long reply streams below them, messages
more than SCREENS screens above the bottom are unmounted too: every layout pass
arranges every mounted widget. Layout cost stays flat however long the chat.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from app.engine_host.protocol import ReplySoFar
from app.tui.tool_text import answered_call
from app.tui.widgets.alternatives import AlternativesView
from app.tui.widgets.message_view import MessageView
from mlxcore import common_prefix_length

WINDOW = 12  # messages kept mounted while following the bottom (about two screens)
PAGE = 8  # messages mounted per scroll to the top
SCREENS = 2  # while a reply streams and the view follows it, what stays mounted above the bottom


class ChatLog(VerticalScroll):
    """Messages of the open chat, oldest first."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.records: list[tuple[str, str]] = []  # every message (role, content) of the chat
        self.first_mounted = 0  # index in records of the first mounted MessageView
        self.live: MessageView | None = None  # the reply being streamed
        self.alternatives: AlternativesView | None = None  # replies side by side, below the messages

    def compose(self) -> ComposeResult:
        yield Static("", classes="earlier")

    def on_mount(self) -> None:
        self.anchor()

    @property
    def views(self) -> list[MessageView]:
        # the children, not a CSS query: a query matches selectors on every descendant of the log
        return [child for child in self.children if isinstance(child, MessageView)]

    # the conversation ------------------------------------------------------------------

    async def sync(self, messages: list[tuple[str, str]]) -> None:
        """Show ``messages``: keep the views that still match, replace the rest (no full re-render)."""
        if self.live is not None and not self.live.streaming:
            self._adopt_live(self.live, messages)
        keep = common_prefix_length(self.records, messages)
        if keep < self.first_mounted:
            keep = 0  # the change is above what is mounted: show the chat afresh
        await self.remove_children(self.views[max(keep - self.first_mounted, 0):])
        if keep == 0:
            self.first_mounted = max(len(messages) - WINDOW, 0)
        self.records = list(messages)
        new = [self._view(index) for index in range(max(keep, self.first_mounted), len(messages))]
        if new:
            await self.mount_all(new, before=self.alternatives)
        await self._trim_when_following()
        self._update_earlier()

    def _view(self, index: int) -> MessageView:
        role, content = self.records[index]
        return MessageView(role, content, call=answered_call(self.records, index) if role == "tool" else None)

    def _adopt_live(self, shown: MessageView, messages: list[tuple[str, str]]) -> None:
        """The finished streamed reply stands for the stored one: no re-render when the text matches."""
        index = len(self.records) - 1
        # a reply with tool calls is shown afresh: its calls as lines, not as the text streamed
        if (0 <= index < len(messages) and messages[index][0] == "assistant"
                and "<tool_call>" not in messages[index][1]):
            if (shown.thinking.strip(), shown.answer.strip()) == tuple(
                    s.strip() for s in _split(messages[index][1])):
                self.records[index] = messages[index]
        self.live = None

    async def start_reply(self, so_far: str = "") -> MessageView:
        """Mount an assistant message to stream into (holding ``so_far``: the reply as generated until now)."""
        self.live = MessageView("assistant", so_far, streaming=True)
        self.records.append(("assistant", ""))
        await self.mount(self.live)
        return self.live

    async def drop_live(self) -> None:
        """Take away the reply being streamed (its chat left the screen, still answering)."""
        if self.live is not None:
            await self.live.remove()
            self.records.pop()
            self.live = None

    async def show_alternatives(self, replies: tuple[ReplySoFar, ...]) -> AlternativesView:
        """Mount the replies of a turn side by side, below the messages."""
        await self.remove_alternatives()
        self.alternatives = AlternativesView(replies)
        await self.mount(self.alternatives)
        return self.alternatives

    async def remove_alternatives(self) -> None:
        if self.alternatives is not None:
            await self.alternatives.remove()
            self.alternatives = None

    async def stream(self, thinking: str, answer: str) -> None:
        """Add a batch of the reply being generated (starting it if needed)."""
        live = self.live or await self.start_reply()
        await live.append(thinking, answer)
        await self._trim_above_screens()

    # virtualisation ---------------------------------------------------------------------

    async def _trim_when_following(self) -> None:
        views = self.views
        if len(views) <= WINDOW + PAGE or not self._following():
            return
        extra = len(views) - WINDOW
        for view in views[:extra]:
            await view.remove()
        self.first_mounted += extra

    async def _trim_above_screens(self) -> None:
        """While following, unmount the messages more than SCREENS screens above the bottom.

        It waits until they add up to a whole screen, so that a growing reply unmounts
        them a screen at a time, not one per update.
        """
        screen = self.scrollable_content_region.height
        if not screen or not self._following():
            return
        views = self.views
        heights = [view.outer_size.height for view in views]
        below = 0
        for index in range(len(views) - 1, 0, -1):
            below += heights[index]
            if below >= SCREENS * screen:
                break
        else:
            return
        if sum(heights[:index]) >= screen:
            drop = views[:index]
            await self.remove_children(drop)
            self.first_mounted += len(drop)
            self._update_earlier()

    def _following(self) -> bool:
        return self.is_anchored and not self._anchor_released

    async def show_earlier(self) -> None:
        """Mount the previous page of messages above the first mounted one, keeping the view still."""
        if self.first_mounted == 0:
            return
        start = max(self.first_mounted - PAGE, 0)
        views = self.views
        new = [self._view(index) for index in range(start, self.first_mounted)]
        await self.mount_all(new, before=views[0] if views else None)
        self.first_mounted = start
        self._update_earlier()
        if views:
            self.call_after_refresh(self.scroll_to_widget, views[0], top=True, animate=False)

    def _update_earlier(self) -> None:
        marker = self.query_one(".earlier", Static)
        marker.display = self.first_mounted > 0
        marker.update(f"↑ {self.first_mounted} earlier messages: scroll up to show them")

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if new <= 0 and old > 0 and self.first_mounted > 0:
            self.run_worker(self.show_earlier(), exclusive=True, group="earlier")

    # following --------------------------------------------------------------------------

    def follow(self) -> None:
        """Jump to the bottom and follow new text again."""
        self._anchor_released = False
        self.anchor()


def _split(content: str) -> tuple[str, str]:
    from app.tui.text_parts import split_reply
    return split_reply(content)
