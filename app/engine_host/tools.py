"""The engine host's side of tool calls: the tools offered to the model, the calls a reply made.

The window owns the tools (MCP servers, the user's approval); the engine host
only offers their schemas (``Tools``, applied as each turn starts), tells the
window about the calls of a reply it kept (``ToolCalls``), and lets the model
go on once the window sends the results (``ToolResults``, in ``replies``: one
``tool`` message per call, then a reply on the same scheduler as any other).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.engine_host import protocol as p
from app.engine_host.channel import SendEvent

if TYPE_CHECKING:
    from sessions import ChatSession

ENDED_ON_ITS_OWN = ("eos", "stop", "length")  # a reply stopped by the user, or failed, runs no tools


class ToolOffer:
    """The tools the window offers the model (none until it says)."""

    def __init__(self, send: SendEvent) -> None:
        self.send = send
        self.schemas: tuple[p.Schema, ...] = ()

    def set(self, command: p.Tools) -> None:
        self.schemas = tuple(command.schemas)

    def offer(self, session: ChatSession) -> None:
        """The chat's next reply sees the tools offered now (none: the template has no tools section)."""
        if (session.tool_schemas or []) != list(self.schemas):
            session.set_tools(self.schemas)

    def tell_calls(self, session: ChatSession, finish_reason: str) -> None:
        """After the chat on screen kept a reply: its calls, for the window to ask about and run."""
        if finish_reason not in ENDED_ON_ITS_OWN or not self.schemas:
            return
        reply = session.last_reply()
        if reply is not None and reply.tool_calls:
            self.send(p.ToolCalls(tuple(p.ToolCall(call.name, call.arguments) for call in reply.tool_calls)))
