"""Several replies to one turn, side by side: each streams into its own column; the user keeps one.

The view shows what the engine sends and posts ``Picked`` when the user chooses
(keys 1 to n while it has focus, or a column's Keep button); the app sends the
pick to the engine, which makes that reply the chat's.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Label

from app.engine_host.protocol import ReplySoFar
from app.tui.widgets.message_view import MessageView

ENDINGS = {"": "writing…", "eos": "done", "stop": "done", "length": "max tokens reached", "stopped": "stopped",
           "error": "failed"}


class Alternative(Vertical):
    """One column: its number and state, the reply as it streams, and a Keep button."""

    def __init__(self, choice: int, so_far: ReplySoFar) -> None:
        super().__init__(classes="alternative")
        self.choice, self.ended = choice, so_far.ended
        self.view = MessageView("assistant", so_far.raw, streaming=not so_far.ended)
        self.view.can_focus = False  # keys 1-9 pick a reply here, not copy a message's code block
        self.head = Label(self._head(), classes="alternative-head")

    def compose(self) -> ComposeResult:
        yield self.head
        yield self.view
        yield Button(f"Keep {self.choice + 1}", id=f"keep-{self.choice + 1}", compact=True)

    def _head(self) -> str:
        return f"Reply {self.choice + 1} · {ENDINGS.get(self.ended, self.ended)}"

    async def end(self, reason: str) -> None:
        self.ended = reason or "stopped"
        await self.view.finish()
        self.head.update(self._head())


class AlternativesView(Horizontal, can_focus=True):
    """The columns of one turn's replies (see the module docstring)."""

    BINDINGS = [Binding(str(n), f"pick({n})", f"Keep reply {n}", show=False) for n in range(1, 10)]

    class Picked(Message):
        """The user chose reply ``choice`` (counted from 0)."""

        def __init__(self, choice: int) -> None:
            super().__init__()
            self.choice = choice

    def __init__(self, replies: tuple[ReplySoFar, ...]) -> None:
        super().__init__(classes="alternatives")
        self.columns = [Alternative(choice, reply) for choice, reply in enumerate(replies)]
        self.picked = False

    def compose(self) -> ComposeResult:
        yield from self.columns

    @property
    def all_ended(self) -> bool:
        return all(column.ended for column in self.columns)

    async def stream(self, choice: int, thinking: str, answer: str) -> None:
        if 0 <= choice < len(self.columns):
            await self.columns[choice].view.append(thinking, answer)

    async def end(self, choice: int, reason: str) -> None:
        if 0 <= choice < len(self.columns):
            await self.columns[choice].end(reason)

    def action_pick(self, number: int) -> None:
        if 1 <= number <= len(self.columns) and not self.picked:
            self.picked = True  # once: the engine ends the turn with the first pick
            self.post_message(self.Picked(number - 1))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_pick(int((event.button.id or "keep-0").removeprefix("keep-")))
