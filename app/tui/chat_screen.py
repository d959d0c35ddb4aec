"""The main screen: sessions sidebar, the chat, the input and the status line."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header

from app.tui.commands import bindings
from app.tui.widgets.chat_log import ChatLog
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import Sidebar
from app.tui.widgets.status_line import StatusLine


class ChatScreen(Screen):
    """Holds the chat's key bindings, so that dialogs on top of it keep their own keys."""

    BINDINGS = bindings() + [
        Binding("pageup", "scroll_chat(-1)", "Page up", show=False, priority=True),
        Binding("pagedown", "scroll_chat(1)", "Page down", show=False, priority=True),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield Sidebar(id="sidebar")
            with Vertical(id="chat-column"):
                yield ChatLog(id="chat")
                yield PromptInput(id="prompt", placeholder="Message (Enter sends, Shift+Enter or Ctrl+J: new line)")
                yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PromptInput).focus()
        self.query_one(StatusLine).show_note("Loading the model…")

    def action_scroll_chat(self, direction: int) -> None:
        chat = self.query_one(ChatLog)
        (chat.scroll_page_down if direction > 0 else chat.scroll_page_up)(animate=False)
