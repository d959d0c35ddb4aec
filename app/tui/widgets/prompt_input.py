"""The message input: multi-line, Enter sends, Shift+Enter or Ctrl+J adds a line, Up/Down walk the history."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    """A TextArea that posts Submitted on Enter and remembers what was sent."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, *, id: str | None = None, placeholder: str = "") -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", id=id, placeholder=placeholder)
        self.sent: list[str] = []
        self._browse = 0  # 0 = not browsing; n = showing history[-n]
        self._draft = ""  # what was typed before browsing

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.prevent_default()
            event.stop()
            self.submit()
        elif event.key in ("shift+enter", "ctrl+j"):  # many terminals do not report shift+enter
            event.prevent_default()
            event.stop()
            self.insert("\n")
        elif event.key == "up" and self.cursor_location[0] == 0 and self._step(1):
            event.prevent_default()
            event.stop()
        elif event.key == "down" and self.cursor_location[0] == self.document.line_count - 1 and self._step(-1):
            event.prevent_default()
            event.stop()
        else:
            await super()._on_key(event)

    def submit(self) -> None:
        """Send the text (when there is any) and remember it."""
        text = self.take()
        if text is not None:
            self.post_message(self.Submitted(text))

    def take(self) -> str | None:
        """The text typed (remembered, and the box cleared); None when there is none."""
        text = self.text
        if not text.strip():
            return None
        if not self.sent or self.sent[-1] != text:
            self.sent.append(text)
        self._browse, self._draft = 0, ""
        self.clear()
        return text

    def _step(self, direction: int) -> bool:
        """Move through the history (1 = older); False when there is nowhere to go."""
        target = self._browse + direction
        if target < 0 or target > len(self.sent) or (target == 0 and self._browse == 0):
            return False
        if self._browse == 0:
            self._draft = self.text
        self._browse = target
        self.load_text(self._draft if target == 0 else self.sent[-target])
        self.move_cursor(self.document.end)
        return True
