"""What ``ChatSession.send`` returns: the reply's text, with its reasoning, answer and tool calls apart."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcore import ReplyParser, ToolCall


class Reply(str):
    """The reply as generated (a ``str``, as ``send`` always returned), with ``reasoning``, ``content`` (the
    answer, without think block or calls) and ``tool_calls`` read by the reply parser."""

    reasoning: str
    content: str
    tool_calls: tuple[ToolCall, ...]

    @classmethod
    def parse(cls, text: str, tools: Sequence[dict] | None) -> Reply:
        parser = ReplyParser(tools)
        parser.feed(text)
        parser.finish()
        reply = cls(text)
        reply.reasoning, reply.content, reply.tool_calls = parser.reasoning, parser.content, tuple(parser.calls)
        return reply

    def answer_only(self) -> Reply:
        """This reply as its answer alone (a structured reply's JSON), its reasoning kept beside it."""
        reply = Reply(self.content)
        reply.reasoning, reply.content, reply.tool_calls = self.reasoning, self.content, self.tool_calls
        return reply
