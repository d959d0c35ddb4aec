"""Markdown whose growing last paragraph re-lays out the screen only when its height changes.

Textual lays out the whole screen after any widget's text changes. While a reply
streams, its last paragraph grows a few words at a time and keeps its height
until a line wraps, so most updates need only a repaint of that paragraph.
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Markdown

MarkdownParagraph = Markdown.BLOCKS["paragraph_open"]  # Textual's paragraph block (not exported by name)


class SteadyParagraph(MarkdownParagraph):
    """A paragraph that asks for a layout pass only when new text changes its height."""

    def set_content(self, content: Content) -> None:
        width, height = self.content_size
        self._content = content
        self.update(content, layout=False)
        if not (self.is_mounted and width) or self.get_content_height(self.size, self.size, width) != height:
            self.refresh(layout=True)


class SteadyMarkdown(Markdown):
    BLOCKS = {**Markdown.BLOCKS, "paragraph_open": SteadyParagraph}
