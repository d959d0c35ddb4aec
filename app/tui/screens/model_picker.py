"""The model switch (F5): the models that load by name, and a line to type any other reference."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from app.catalog import ModelEntry

CURRENT_MARK = "● "  # before the model the chat runs on


class ModelPicker(ModalScreen[str | None]):
    """Lists the models ``list_models()`` returns (called on a thread: it reads directories), ``current``
    marked. Enter on one, or on a reference typed below the list, dismisses with what to load (a listed
    name typed loads as listed); Escape dismisses with None."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    #model-list { height: auto; max-height: 14; margin: 0 0 1 0; }
    """

    def __init__(self, list_models: Callable[[], list[ModelEntry]], current: str | None) -> None:
        super().__init__(classes="dialog")
        self.list_models, self.current = list_models, current
        self.entries: list[ModelEntry] = []  # as listed, once read

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box -wide", id="model-picker"):
            yield Label("Switch model", classes="dialog-title")
            yield Static("Enter loads the highlighted model, or the one typed below; the chat continues on it. "
                         "Esc cancels. `mlxchat models` lists the same (--models-dir adds a folder's models).",
                         classes="dialog-hint", markup=False)
            yield OptionList(Option("Listing the models…", disabled=True), id="model-list")
            yield Input(placeholder="or type another: a hub repo (org/name), a model folder, an embedded name",
                        id="model-ref")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()
        self.run_worker(self._fill(), exclusive=True)

    async def _fill(self) -> None:
        options = self.query_one(OptionList)
        try:
            self.entries = await asyncio.to_thread(self.list_models)
        except OSError as error:  # an unreadable --models-dir or hub cache: typing a reference still works
            options.clear_options()
            options.add_option(Option(Content(f"Could not list the models: {error}"), disabled=True))
            return
        options.clear_options()
        options.add_options(Option(Content(self._line(entry))) for entry in self.entries)
        current = [i for i, entry in enumerate(self.entries) if self._is_current(entry)]
        options.highlighted = current[0] if current else (0 if self.entries else None)

    def _is_current(self, entry: ModelEntry) -> bool:
        return self.current is not None and self.current in (entry.id, entry.choice.model)

    def _line(self, entry: ModelEntry) -> str:
        mark = CURRENT_MARK if self._is_current(entry) else " " * len(CURRENT_MARK)
        return f"{mark}{entry.id}  ({entry.source})"

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.entries[event.option_index].choice.model)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if not text:
            self.notify("Type a model to load, or pick one from the list.", severity="warning")
            return
        listed = next((entry for entry in self.entries if entry.id == text), None)
        self.dismiss(listed.choice.model if listed else text)
