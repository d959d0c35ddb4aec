"""The help screen: every key of the chat."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Static

from app.tui.commands import ACTIONS, OTHER_KEYS, key_label


def _keys(key: str) -> str:
    return ", ".join(key_label(k).lower() for k in key.split(","))


class HelpScreen(ModalScreen[None]):
    """Lists the keys; any of Escape, Ctrl+\\, F1 or q closes it."""

    BINDINGS = [Binding("escape,ctrl+backslash,f1,q", "dismiss(None)", "Close")]

    def __init__(self) -> None:
        super().__init__(classes="dialog")

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box -wide", id="help"):
            yield Label("mlxchat keys", classes="dialog-title")
            yield DataTable(id="help-keys", cursor_type="none", zebra_stripes=True)
            yield Static("All actions are also in the command palette (ctrl+p). On a Mac laptop hold fn for F-keys; "
                         "Alt is Option where the terminal sends it as Meta. Esc closes this.",
                         classes="dialog-hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("Key", "Action")
        for action in ACTIONS:
            table.add_row(_keys(action.key), f"{action.title}: {action.help}")
        for key, what in OTHER_KEYS:
            table.add_row(key, what)
