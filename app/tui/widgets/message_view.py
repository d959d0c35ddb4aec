"""One chat message: a role label, a collapsible thinking block (replies), and the text as Markdown.

A reply's tool calls show as one line each; a tool's result shows as a
collapsible block with the call it answers (name, arguments, result).
"""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Collapsible, Label, Markdown, Static
from textual.widgets.markdown import MarkdownStream

from app.tui.text_parts import code_blocks, split_reply, word_count
from app.tui.tool_text import call_title, pretty_arguments, shown_calls
from app.tui.widgets.steady_collapsible import SteadyCollapsible
from app.tui.widgets.steady_markdown import SteadyMarkdown
from sessions import printable

TITLE_SECONDS = 1.0  # a live "Thinking… N words" title changes at most this often

ROLE_LABELS = {"user": "You", "assistant": "Assistant", "tool": "Tool"}


class MessageView(Vertical, can_focus=True):
    """Shows one message; a reply can be streamed into it without re-rendering what is already there."""

    BINDINGS = [
        Binding("c,y", "copy", "Copy message"),
        *[Binding(str(n), f"copy_code({n})", f"Copy code block {n}", show=False) for n in range(1, 10)],
    ]

    class CopyRequest(Message):
        """The user asked to copy some text of this message."""

        def __init__(self, text: str, what: str) -> None:
            super().__init__()
            self.text, self.what = text, what

    def __init__(self, role: str, content: str = "", *, streaming: bool = False,
                 call: tuple[str, str] | None = None) -> None:
        super().__init__(classes=f"message -{role}")
        self.role = role
        self.call = call  # a tool message: the (name, arguments) of the call it answers, when known
        self.thinking, self.answer = split_reply(content) if role == "assistant" else ("", content)
        if role == "assistant" and "<tool_call>" in self.answer:
            self.answer = shown_calls(self.answer)
        self.streaming = streaming
        self._thinking_stream: MarkdownStream | None = None  # only while the open block streams
        self._answer_stream: MarkdownStream | None = None
        self._title_time = 0.0  # when the thinking block's title last changed
        # the parts, kept at hand: a query walks every block of a long reply on each update
        self._answer_markdown = SteadyMarkdown(self.answer, classes="answer")
        self._thinking_markdown = SteadyMarkdown(self.thinking.strip(), classes="thinking-text")
        self._block = SteadyCollapsible(self._thinking_markdown, title=self._thinking_title(), collapsed=True,
                                  classes="thinking")

    def compose(self) -> ComposeResult:
        yield Label(ROLE_LABELS.get(self.role, self.role), classes="role")
        if self.role == "assistant":
            self._block.display = bool(self.thinking.strip()) or self.streaming
            yield self._block
        if self.role == "tool":
            yield self._tool_block()
            return
        yield self._answer_markdown

    def _tool_block(self) -> SteadyCollapsible:
        """The result, folded under the call it answers (name, arguments, result)."""
        name, arguments = self.call or ("tool", "{}")
        # the server's text and the model's arguments, escaped: a terminal would act on control characters
        body = Static(printable(f"Arguments:\n{pretty_arguments(arguments)}\n\nResult:\n{self.answer}", limit=None,
                                keep="\n\t"), markup=False, classes="tool-text")
        return SteadyCollapsible(body, title=printable(call_title(name, arguments, self.answer), limit=None),
                                 collapsed=True, classes="tool-call")

    @property
    def content(self) -> str:
        """The message as shown: thinking (if any) and answer."""
        return self.answer if not self.thinking else f"<think>{self.thinking}</think>\n\n{self.answer}"

    def _thinking_title(self) -> str:
        words = word_count(self.thinking)
        if self.streaming and not self.answer:
            return f"Thinking… {words} words" if words else "Thinking…"
        return f"Thought for {words} words"

    # streaming ------------------------------------------------------------------------------
    # Every change of a widget's text costs the whole screen a layout pass, so a streamed reply
    # changes as little as it can: a collapsed thinking block only counts words (its text is
    # written when it is opened or the reply ends), its title changes at most once a second (with
    # no layout pass unless its width changes), and
    # the growing text claims lines a few at a time (SteadyMarkdown.growing).

    async def append(self, thinking: str, answer: str) -> None:
        """Add a batch of generated text (streams keep Markdown parsing incremental)."""
        if thinking:
            self.thinking += thinking
            if self._thinking_stream is not None:
                await self._thinking_stream.write(thinking)
        started = bool(answer) and self._answer_stream is None
        if started:
            self._thinking_markdown.stop_growing()  # thinking is over
            self._answer_markdown.growing = True
            self._answer_stream = Markdown.get_stream(self._answer_markdown)
        if answer:
            self.answer += answer
            await self._answer_stream.write(answer)
        if thinking or started:
            self._update_thinking_block(throttled=not answer)

    async def finish(self) -> None:
        """The reply ended: flush the streams, show all thinking and settle the block's title."""
        self.streaming = False
        for stream in (self._thinking_stream, self._answer_stream):
            if stream is not None:
                await stream.stop()
        self._thinking_stream = self._answer_stream = None
        self._answer_markdown.stop_growing()
        self._thinking_markdown.stop_growing()
        if self._thinking_markdown.source != self.thinking.strip():
            await self._thinking_markdown.update(self.thinking.strip())
        self._update_thinking_block()

    async def on_collapsible_expanded(self, event: Collapsible.Expanded) -> None:
        """Opened while thinking streams: show what came so far, then stream the rest into it."""
        event.stop()
        if self.streaming and self._thinking_stream is None:
            markdown = self._thinking_markdown
            shown = self.thinking
            markdown.growing = not self.answer
            await markdown.update(shown)
            self._thinking_stream = Markdown.get_stream(markdown)
            if self.thinking != shown:  # batches that arrived while it updated
                await self._thinking_stream.write(self.thinking[len(shown):])

    def _update_thinking_block(self, throttled: bool = False) -> None:
        now = time.monotonic()
        if throttled and now - self._title_time < TITLE_SECONDS:
            return
        self._title_time = now
        self._block.display = bool(self.thinking.strip())
        self._block.title = self._thinking_title()

    def set_thinking_expanded(self, expanded: bool) -> None:
        if self.role == "assistant":
            self._block.collapsed = not expanded

    # copying ------------------------------------------------------------------------------

    def action_copy(self) -> None:
        self.post_message(self.CopyRequest(self.answer, "message"))

    def action_copy_code(self, number: int) -> None:
        blocks = code_blocks(self.answer)
        if number > len(blocks):
            self.notify(f"This message has {len(blocks)} code block(s).", severity="warning")
            return
        self.post_message(self.CopyRequest(blocks[number - 1], f"code block {number}"))
