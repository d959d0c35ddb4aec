"""Markdown whose growing last paragraph re-lays out the screen only every few lines.

Textual lays out the whole screen after any widget's text changes. While a reply
streams, its last paragraph grows a few words at a time and keeps its height
until a line wraps, so most updates need only a repaint of that paragraph. While
``growing``, the last paragraph also claims its height in steps of GROW_LINES
(the spare lines stay blank below the text), so a line wrap needs no layout
either until the step is full.
"""

from __future__ import annotations

from textual.content import Content
from textual.geometry import Size
from textual.widgets import Markdown

MarkdownParagraph = Markdown.BLOCKS["paragraph_open"]  # Textual's paragraph block (not exported by name)
GROW_LINES = 8  # with 3 updates a second: 39-42 layout passes on the bench reply, 52-53 with 4


class SteadyParagraph(MarkdownParagraph):
    """A paragraph that asks for a layout pass only when new text changes its height."""

    def set_content(self, content: Content) -> None:
        width, height = self.content_size
        self._content = content
        self.update(content, layout=False)
        if not (self.is_mounted and width) or self.get_content_height(self.size, self.size, width) != height:
            self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        height = super().get_content_height(container, viewport, width)
        markdown = self.parent
        if isinstance(markdown, SteadyMarkdown) and markdown.growing and markdown.children[-1] is self:
            return -(-height // GROW_LINES) * GROW_LINES
        return height


class SteadyMarkdown(Markdown):
    BLOCKS = {**Markdown.BLOCKS, "paragraph_open": SteadyParagraph}

    growing = False  # set while a reply streams into this Markdown

    def stop_growing(self) -> None:
        """The text is complete: paragraphs take their exact height again."""
        if self.growing:
            self.growing = False
            if self.children:
                self.children[-1].refresh(layout=True)
