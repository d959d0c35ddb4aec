"""The sessions sidebar: every saved chat, newest first, searchable by title; it marks the chats answering."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

from app.engine_host.protocol import SessionRow
from app.tui.widgets import status_line


def _age(updated: float, now: float) -> str:
    minutes = max(now - updated, 0) / 60
    if minutes < 60:
        return f"{minutes:.0f}m"
    return f"{minutes / 60:.0f}h" if minutes < 60 * 24 else f"{minutes / 60 / 24:.0f}d"


class SessionList(OptionList):
    """The sessions; Delete and r act on the highlighted one."""

    titles: dict[str, str] = {}

    BINDINGS = [Binding("delete", "delete_session", "Delete chat"), Binding("r", "rename_session", "Rename chat")]

    def action_delete_session(self) -> None:
        self._ask("delete")

    def action_rename_session(self) -> None:
        self._ask("rename")

    def _ask(self, action: str) -> None:
        if self.highlighted is not None:
            option = self.get_option_at_index(self.highlighted)
            self.post_message(Sidebar.Manage(action, option.id or "", self.titles.get(option.id or "", "")))


class Sidebar(Vertical):
    """A search box over the list of sessions; posts Chosen, Search and Manage."""

    class Chosen(Message):
        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    class Search(Message):
        def __init__(self, query: str) -> None:
            super().__init__()
            self.query = query

    class Manage(Message):
        def __init__(self, action: str, session_id: str, title: str) -> None:
            super().__init__()
            self.action, self.session_id, self.title = action, session_id, title

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.current: str | None = None
        self.rows: tuple[SessionRow, ...] = ()
        self.answering: frozenset[str] = frozenset()  # chats generating a reply (on screen or not)
        self.picking: frozenset[str] = frozenset()  # chats whose replies side by side wait for a pick

    def compose(self) -> ComposeResult:
        yield Input(placeholder="Search chats", id="session-search")
        yield SessionList(id="session-list")

    def show(self, rows: tuple[SessionRow, ...], current: str | None) -> None:
        """Replace the list, keeping the open chat highlighted."""
        self.rows, self.current = rows, current
        try:
            listing = self.query_one(SessionList)
        except NoMatches:
            return  # not composed yet: on_mount shows the rows
        self._fill(listing)

    def mark(self, answering: tuple[str, ...], picking: tuple[str, ...]) -> None:
        """Show which chats are answering and which wait for a pick."""
        self.answering, self.picking = frozenset(answering), frozenset(picking)
        self.show(self.rows, self.current)

    def on_mount(self) -> None:
        self._fill(self.query_one(SessionList))

    def _fill(self, listing: SessionList) -> None:
        now = time.time()
        listing.clear_options()
        listing.titles = {row.session_id: row.title for row in self.rows}
        for row in self.rows:
            mark = "● " if row.session_id == self.current else "  "
            title = row.title + (" (cannot be read)" if row.broken else "")
            title += " (open in another window)" if row.open_elsewhere else ""
            title += " · answering…" if row.session_id in self.answering else ""
            title += " · pick a reply" if row.session_id in self.picking else ""
            age = f"  [dim]{_age(row.updated, now)}[/]" if status_line.SHOW_FIGURES else ""
            listing.add_option(Option(f"{mark}{title}{age}", id=row.session_id))
        ids = [row.session_id for row in self.rows]
        if self.current in ids:
            listing.highlighted = ids.index(self.current)

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Search(event.value))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.post_message(self.Chosen(event.option.id))
