"""Settings of the open chat: system prompt, sampling, max tokens, draft and thinking; and the window's
number of replies side by side."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, Switch, TextArea

from app.engine_host.protocol import Configure, Conversation

NUMBER_FIELDS = (("temperature", "Temperature (0 = greedy)", float), ("top_p", "Top-p (1 = off)", float),
                 ("top_k", "Top-k (0 = off)", int), ("min_p", "Min-p (0 = off)", float),
                 ("max_tokens", "Max tokens (empty: no limit)", int))
OPTIONAL = {"max_tokens"}  # may be left empty (None)
ALTERNATIVES = range(2, 5)  # replies side by side (f7): more do not fit the screen's width


@dataclass(frozen=True)
class ChosenSettings:
    configure: Configure  # the chat's settings, for the engine
    alternatives: int  # how many replies f7 asks for (the window's setting, not the chat's)


class SettingsScreen(ModalScreen[ChosenSettings | None]):
    """Edits the chat's settings; dismisses with ChosenSettings, or None when cancelled."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "apply", "Apply", priority=True)]

    def __init__(self, state: Conversation, model_defaults: Mapping[str, float] | None = None,
                 alternatives: int = 2) -> None:
        super().__init__(classes="dialog")
        self.state = state
        self.model_defaults = model_defaults or {}  # the sampling the model's generation_config.json sets
        self.alternatives = alternatives

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box -wide", id="settings"):
            yield Label("Chat settings", classes="dialog-title")
            with VerticalScroll(id="settings-fields"):
                for name, label, _ in NUMBER_FIELDS:
                    with Horizontal(classes="field"):
                        yield Label(f"{label}{self._source(name)}")
                        value = self.state.params.get(name)
                        yield Input("" if value is None else str(value), id=f"set-{name}")
                with Horizontal(classes="field"):
                    yield Label("Speculative decoding (draft model)")
                    yield Switch(self.state.use_draft, id="set-draft", disabled=not self.state.has_draft)
                with Horizontal(classes="field"):
                    yield Label("Thinking before answering")
                    yield Switch(self.state.think, id="set-think")
                with Horizontal(classes="field"):
                    yield Label(f"Replies side by side, f7 ({ALTERNATIVES[0]}-{ALTERNATIVES[-1]})")
                    yield Input(str(self.alternatives), id="set-alternatives")
                yield Label("System prompt")
                yield TextArea(self.state.system or "", id="set-system", soft_wrap=True)
            yield Static("", id="settings-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Apply (ctrl+s)", id="apply", variant="primary")

    def _source(self, name: str) -> str:
        """What the model's generation_config.json recommends ("-": nothing, mlxchat's default applies)."""
        if name == "max_tokens":
            return ""
        if name in self.model_defaults:
            return f" (model: {self.model_defaults[name]:g})"
        return " (model: -)"

    def read(self) -> ChosenSettings:
        """The settings as entered; ValueError names a field that is not a number."""
        params: dict[str, float | None] = {}  # None: no max_tokens
        for name, label, kind in NUMBER_FIELDS:
            raw = self.query_one(f"#set-{name}", Input).value.strip()
            if not raw and name in OPTIONAL:
                params[name] = None
                continue
            try:
                params[name] = kind(raw)
            except ValueError:
                raise ValueError(f"{label}: {raw!r} is not a {'whole ' if kind is int else ''}number") from None
        draft = self.query_one("#set-draft", Switch).value
        configure = Configure(params=params, system=self.query_one("#set-system", TextArea).text,
                              think=self.query_one("#set-think", Switch).value,
                              use_draft=draft if self.state.has_draft else None)
        return ChosenSettings(configure, self._alternatives())

    def _alternatives(self) -> int:
        raw = self.query_one("#set-alternatives", Input).value.strip()
        if not raw.isdigit() or int(raw) not in ALTERNATIVES:
            raise ValueError(f"Replies side by side: {raw!r} is not one of {ALTERNATIVES[0]} to {ALTERNATIVES[-1]}")
        return int(raw)

    def action_apply(self) -> None:
        try:
            self.dismiss(self.read())
        except ValueError as error:
            self.query_one("#settings-error", Static).update(str(error))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.dismiss(None)
