"""Asks before a tool runs: the call's name, where it runs and its arguments; allow once, always, or deny.

Everything shown comes from an MCP server or the model: ``printable`` escapes what a terminal would act on.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from app.tui.tool_text import pretty_arguments
from sessions import printable

ONCE, ALWAYS, DENY = "once", "always", "deny"


class ToolApproval(ModalScreen[str]):
    """Dismisses with ONCE, ALWAYS (this tool, for the rest of this window's life) or DENY (also Escape)."""

    BINDINGS = [Binding("a", "dismiss('once')", "Allow once"), Binding("y", "dismiss('always')", "Always"),
                Binding("escape,d,n", "dismiss('deny')", "Deny")]

    def __init__(self, name: str, server: str, arguments: str, description: str = "") -> None:
        super().__init__(classes="dialog")
        self.tool_name, self.server, self.arguments, self.description = name, server, arguments, description

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box -wide", id="tool-approval"):
            yield Label(f"The model wants to run {printable(self.tool_name)} ({printable(self.server)})", classes="dialog-title",
                        markup=False)
            if self.description:
                yield Static(printable(self.description, limit=None, keep="\n"), classes="dialog-hint", markup=False)
            with VerticalScroll(id="tool-arguments"):
                yield Static(printable(pretty_arguments(self.arguments), limit=None, keep="\n"), markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Deny (d)", id=DENY, variant="error")
                yield Button(f"Always allow {printable(self.tool_name)} (y)", id=ALWAYS)
                yield Button("Allow once (a)", id=ONCE, variant="primary")

    def on_mount(self) -> None:
        self.query_one(f"#{ONCE}", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id)
