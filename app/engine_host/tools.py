"""The engine host's side of tool calls: the tools offered to the model, the calls a reply made, their results.

The window owns the tools (MCP servers, the user's approval); the engine host
only offers their schemas (``Tools``, applied as each turn starts), tells the
window about the calls of a reply it kept (``ToolCalls``), and lets the model
go on once the window sends the results (``ToolResults``: one ``tool`` message
per call, then a reply on the same scheduler as any other).
"""

from __future__ import annotations

from typing import Any

from app.engine_host import protocol as p

ENDED_ON_ITS_OWN = ("eos", "stop", "length")  # a reply stopped by the user, or failed, runs no tools


class ToolCommands:
    """Mixed into EngineServer; uses its session, chat, send and ReplyCommands' _start."""

    tools: tuple[dict[str, Any], ...] = ()

    def _on_tools(self, command: p.Tools) -> None:
        self.tools = tuple(command.schemas)

    def _offer_tools(self, session: Any) -> None:
        """The chat's next reply sees the tools offered now (none: the template has no tools section)."""
        if (session.tool_schemas or []) != list(self.tools):
            session.set_tools(self.tools)

    def _on_toolresults(self, command: p.ToolResults) -> None:
        results = command.results
        self._start(1, lambda s, batch, n: s.start_tool_results(results, batch),
                    lambda s: s.stream_tool_results(results))

    def _tell_tool_calls(self, session: Any, finish_reason: str) -> None:
        """After the chat on screen kept a reply: its calls, for the window to ask about and run."""
        if finish_reason not in ENDED_ON_ITS_OWN or not self.tools:
            return
        reply = session.last_reply()
        if reply is not None and reply.tool_calls:
            self.send(p.ToolCalls(tuple(p.ToolCall(call.name, call.arguments) for call in reply.tool_calls)))

