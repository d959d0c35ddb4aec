"""A Collapsible whose title can change without re-laying out the screen.

A live thinking block retitles itself about once a second ("Thinking… 120
words"). Textual's title widget asks for a layout pass on every change, and a
layout pass arranges every widget on the screen (docs/benchmarks.md, the window).
The title is one line and as wide as its text, so only a change of width
needs one.
"""

from __future__ import annotations

from textual.visual import VisualType
from textual.widget import Widget
from textual.widgets import Collapsible
from textual.widgets._collapsible import CollapsibleTitle  # the title class Collapsible builds


class SteadyTitle(CollapsibleTitle):
    """A collapsible's title that asks for a layout pass only when its width changes."""

    _shown_width: int | None = None  # cells of the title shown; None before the first

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        # CollapsibleTitle passes Content; anything else is always re-laid out
        before, self._shown_width = self._shown_width, getattr(content, "cell_length", None)
        same = self.is_mounted and before is not None and before == self._shown_width
        super().update(content, layout=layout and not same)


class SteadyCollapsible(Collapsible):
    """``Collapsible`` with a ``SteadyTitle``."""

    def __init__(self, *children: Widget, title: str = "Toggle", collapsed: bool = True, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(*children, title=title, collapsed=collapsed, id=id, classes=classes)
        old = self._title
        self._title = SteadyTitle(label=title, collapsed_symbol=old.collapsed_symbol,
                                  expanded_symbol=old.expanded_symbol, collapsed=collapsed)

