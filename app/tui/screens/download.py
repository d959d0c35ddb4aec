"""The download screen: a progress bar while a hub model downloads, with a way out."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, ProgressBar, Static


class DownloadScreen(ModalScreen[bool]):
    """Shows download progress; dismisses with True when the user cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel download")]

    def __init__(self, model: str) -> None:
        super().__init__(classes="dialog")
        self.model = model
        self.done, self.total = 0, 0

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Label(f"Downloading {self.model}", classes="dialog-title")
            yield Static("First start: the model is fetched once from the Hugging Face hub and cached.",
                         classes="dialog-hint")
            yield ProgressBar(id="download-bar", show_eta=True)
            yield Static("", id="download-bytes")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel (use the embedded demo model)", id="cancel", variant="warning")

    def progress(self, done: int, total: int) -> None:
        """Show ``done`` of ``total`` bytes (kept until the screen is mounted)."""
        self.done, self.total = done, total
        if self.is_mounted:
            self._show()

    def on_mount(self) -> None:
        self._show()

    def _show(self) -> None:
        self.query_one(ProgressBar).update(total=max(self.total, 1), progress=self.done)
        self.query_one("#download-bytes", Static).update(
            f"{self.done / 2**20:.0f} MB of {self.total / 2**20:.0f} MB")

    def action_cancel(self) -> None:
        self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(True)
