"""Small modal dialogs: an error with what to do, a text prompt, a yes/no question."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static, TextArea


class ErrorDialog(ModalScreen[bool]):
    """Says what went wrong; dismisses with True when the user chose to quit (fatal errors)."""

    BINDINGS = [Binding("escape,enter", "dismiss(False)", "Close")]

    def __init__(self, title: str, message: str, fatal: bool = False) -> None:
        super().__init__(classes="dialog")
        self.title_text, self.message, self.fatal = title, message, fatal

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box -error"):
            yield Label(self.title_text, classes="dialog-title")
            yield Static(self.message, classes="dialog-message", markup=False)
            with Horizontal(classes="dialog-buttons"):
                if self.fatal:
                    yield Button("Quit", id="quit", variant="error")
                yield Button("OK", id="ok", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "quit")


class ChoiceDialog(ModalScreen[str | None]):
    """An error with several ways on: dismisses with the id of the button chosen (None: closed with escape)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, title: str, message: str, choices: list[tuple[str, str]]) -> None:
        super().__init__(classes="dialog")
        self.title_text, self.message, self.choices = title, message, choices  # choices: (id, label), first = default

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box -error"):
            yield Label(self.title_text, classes="dialog-title")
            yield Static(self.message, classes="dialog-message", markup=False)
            with Horizontal(classes="dialog-buttons"):
                for index, (choice, label) in enumerate(self.choices):
                    yield Button(label, id=choice, variant="primary" if index == 0 else "default")

    def on_mount(self) -> None:
        self.query_one(Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id)


class TextDialog(ModalScreen[str | None]):
    """Asks for a text (a title, an edited message, a model name); None when cancelled."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "accept", "OK", priority=True)]

    def __init__(self, title: str, text: str = "", hint: str = "") -> None:
        super().__init__(classes="dialog")
        self.title_text, self.text, self.hint = title, text, hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Label(self.title_text, classes="dialog-title")
            if self.hint:
                yield Static(self.hint, classes="dialog-hint", markup=False)
            yield TextArea(self.text, id="dialog-text", soft_wrap=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("OK (ctrl+s)", id="ok", variant="primary")

    def on_mount(self) -> None:
        area = self.query_one(TextArea)
        area.focus()
        area.move_cursor(area.document.end)

    def action_accept(self) -> None:
        self.dismiss(self.query_one(TextArea).text)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self.action_accept()
        else:
            self.dismiss(None)


class ConfirmDialog(ModalScreen[bool]):
    """A yes/no question."""

    BINDINGS = [Binding("escape,n", "dismiss(False)", "No"), Binding("y", "dismiss(True)", "Yes")]

    def __init__(self, question: str) -> None:
        super().__init__(classes="dialog")
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Static(self.question, classes="dialog-message", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("No", id="no")
                yield Button("Yes", id="yes", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")
