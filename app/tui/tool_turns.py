"""The window's side of tool calls: its MCP servers, the user's approval of each call, and the results.

When a reply the engine kept calls tools (``ToolCalls``), each call in turn is
shown with its arguments and waits for the user: allow once, always allow this
tool (until the window closes), or deny. An allowed call runs on the MCP hub's
own thread; a denied one, a tool switched off, a failure or a call past its
server's timeout is a result too, so the model always reads one result per call
and goes on (``ToolResults``). A model that keeps calling is stopped after
MAX_TOOL_ROUNDS rounds without a message from the user.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from app.engine_host import protocol as p
from app.tui.host import ChatHost
from app.tui.screens.mcp_tools import McpToolsScreen
from app.mcp.config import McpConfigError, remember_always_allowed
from app.tui.screens.tool_approval import ALWAYS, DENY, ToolApproval
from sessions import printable

if TYPE_CHECKING:
    from app.mcp.hub import McpHub, ServerTools

MAX_TOOL_ROUNDS = 8
FAILED_NOTE_S = 30.0  # seconds a server's failure to start stays in a note


def denied(name: str) -> str:
    return f"The user denied this call: {name} was not run. Do not call it again for this request."


class ToolTurns(ChatHost):
    """Mixed into ChatApp; uses its client, status, notify, push_screen(_wait), run_worker and _generate."""

    mcp: McpHub | None = None  # None without MCP servers
    mcp_config: str | None = None
    mcp_servers: list[ServerTools] = []  # once connected
    tools_ready = False  # the servers answered (or failed) and the engine was told the tools
    switched_off: frozenset[str] = frozenset()
    always_allowed: set[tuple[str, str]]  # (server, its tool name) run without asking: alwaysAllow, "always"
    bundled_servers: frozenset[str] = frozenset()  # servers not in the MCP config file (the demo's)
    running_tools = False  # calls wait for the user's answer, or run
    tool_rounds = 0  # rounds of calls since the user's last message

    def _start_mcp(self) -> None:
        if self.mcp is not None:
            self.run_worker(self._connect_mcp(self.mcp), group="mcp")

    async def _connect_mcp(self, hub: McpHub) -> None:
        self.mcp_servers = await asyncio.wrap_future(hub.start())
        failed = [server for server in self.mcp_servers if server.error]
        for server in failed:
            self.notify(printable(f"MCP server {server.server}: {server.error}", limit=None), title="MCP",
                        severity="warning", timeout=FAILED_NOTE_S, markup=False)  # "[Errno 2]" is no markup
        # kept on the main screen (the status line) after the note goes, until the window closes
        self.status.warning = printable("MCP server " + ", ".join(s.server for s in failed) + " did not start (f4)",
                                        limit=None) if failed else ""
        if self.ready and not self.generating:
            self.status.show_idle()
        self._offer_tools()
        self.tools_ready = True

    def _offer_tools(self) -> None:
        """Tell the engine which tools to offer the model (every Ready: a new engine knows none)."""
        if self.mcp_servers:
            self.client.send(p.Tools(tuple(tool.schema() for server in self.mcp_servers for tool in server.tools
                                           if tool.name not in self.switched_off)))

    def action_mcp_tools(self) -> None:
        self.push_screen(McpToolsScreen(self.mcp_servers, self.switched_off, self.mcp_config), self._tools_chosen)

    def _tools_chosen(self, switched_off: frozenset[str] | None) -> None:
        if switched_off is not None and switched_off != self.switched_off:
            self.switched_off = switched_off
            self._offer_tools()
            self.notify(printable("Tools offered from the next reply on: " + (", ".join(sorted(
                tool.name for server in self.mcp_servers for tool in server.tools if tool.name not in switched_off))
                or "none") + ".", limit=None), title="MCP", markup=False)

    # a reply's calls --------------------------------------------------------------------------

    async def _engine_toolcalls(self, event: p.ToolCalls) -> None:
        self.tool_rounds += 1
        if self.tool_rounds > MAX_TOOL_ROUNDS:
            self.notify(f"The model called tools {MAX_TOOL_ROUNDS} times in a row: these calls were not run. "
                        "Send a message to go on.", title="Tools", severity="warning")
            return
        self.running_tools = True
        self.run_worker(self._answer_calls(event.calls), group="tools")

    async def _answer_calls(self, calls: tuple[p.ToolCall, ...]) -> None:
        results = []
        try:
            for call in calls:
                results.append(await self._answer_call(call))
        finally:
            self.running_tools = False
        if self._engine_running():
            self._generate(p.ToolResults(tuple(results)))

    def _always_allow(self, server: str, name: str) -> None:
        """``server``'s tool ``name`` runs without asking from now on, in this window and (kept in the MCP
        config's ``alwaysAllow``) the next ones; a config that cannot be written says so, and only this window knows.
        A bundled server's tools (``--demo-tools``) are allowed for this window: the file has no entry for it."""
        self.always_allowed.add((server, name))
        if self.mcp_config is None or server in self.bundled_servers:
            return
        try:
            remember_always_allowed(self.mcp_config, server, name)
        except McpConfigError as error:
            self.notify(printable(f"{error} (allowed in this window only)", limit=None), title="MCP", severity="warning",
                        markup=False)

    async def _answer_call(self, call: p.ToolCall) -> str:
        """The result the model reads for ``call``: asked first, then run (or refused, or an error)."""
        hub = self.mcp
        tool = hub.tools.get(call.name) if hub is not None else None
        if hub is None or tool is None or call.name in self.switched_off:
            return f"Error: there is no tool {call.name!r} to run (it is not offered, or it was switched off)."
        try:
            arguments = json.loads(call.arguments)
        except ValueError as error:
            return f"Error: the arguments of {call.name} are not JSON ({error})."
        if not isinstance(arguments, dict):
            return f"Error: the arguments of {call.name} must be a JSON object."
        if (tool.server, tool.remote_name) not in self.always_allowed:
            answer = await self.push_screen_wait(ToolApproval(call.name, tool.server, call.arguments, tool.description))
            if answer == DENY:
                return denied(call.name)
            if answer == ALWAYS:
                self._always_allow(tool.server, tool.remote_name)
        self.status.show_note(f"{self.status.model} · running {printable(call.name)}…")
        return await asyncio.wrap_future(hub.call(call.name, arguments))
