"""A Collapsible whose title can change without re-laying out the screen.

A live thinking block retitles itself about once a second ("Thinking… 120
words"). Textual's title widget asks for a layout pass on every change, and a
layout pass arranges every widget on the screen (~20 ms here, a quarter of the
passes while a reply streams). The title is one line and as wide as its text,
so only a change of width needs one.
"""

from __future__ import annotations

from textual.content import Content
from textual.visual import VisualType
from textual.widgets import Collapsible
from textual.widgets._collapsible import CollapsibleTitle  # the title class Collapsible builds


class SteadyTitle(CollapsibleTitle):
    """A collapsible's title that asks for a layout pass only when its width changes."""

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        before = getattr(self, "_shown_width", None)
        self._shown_width = _cell_length(content)
        super().update(content, layout=layout and (not self.is_mounted or before != self._shown_width))


class SteadyCollapsible(Collapsible):
    """``Collapsible`` with a ``SteadyTitle``."""

    def __init__(self, *children, title: str = "Toggle", collapsed: bool = True, **kwargs) -> None:
        super().__init__(*children, title=title, collapsed=collapsed, **kwargs)
        old = self._title
        self._title = SteadyTitle(label=title, collapsed_symbol=old.collapsed_symbol,
                                  expanded_symbol=old.expanded_symbol, collapsed=collapsed)


def _cell_length(content: VisualType) -> int | None:
    """Terminal cells the text takes (None for what is not text: always re-laid out)."""
    if isinstance(content, Content):
        return content.cell_length
    if isinstance(content, str):
        return Content(content).cell_length
    return None
