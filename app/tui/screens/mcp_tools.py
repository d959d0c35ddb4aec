"""The MCP servers and their tools: which answered, what each tool does, and which are switched off."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Label, SelectionList, Static
from textual.widgets.selection_list import Selection

from sessions import printable

if TYPE_CHECKING:
    from app.mcp.hub import McpTool

DESCRIPTION_SHOWN = 60  # characters of a tool's description in the list


class McpToolsScreen(ModalScreen[frozenset[str]]):
    """Lists every server and its tools; space (or a click) switches a tool off or on. Dismisses with the
    names of the tools switched off."""

    BINDINGS = [Binding("escape,f4", "close", "Close")]

    def __init__(self, servers: list, switched_off: frozenset[str], config: str | None) -> None:
        super().__init__(classes="dialog")
        self.servers, self.switched_off, self.config = servers, switched_off, config  # app.mcp.hub.ServerTools

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box -wide", id="mcp-tools"):
            yield Label("MCP tools", classes="dialog-title")
            if not self.servers:
                yield Static(self._none_text(), classes="dialog-message", markup=False)
            for server in self.servers:
                state = f"error: {printable(server.error, limit=None)}" if server.error else f"{len(server.tools)} tools"
                yield Static(f"{printable(server.server)} ({server.transport}): {state}", classes="dialog-message",
                             markup=False)
            tools = [tool for server in self.servers for tool in server.tools]
            if tools:
                yield SelectionList[str](*(Selection(Content(_line(tool)), tool.name, tool.name not in self.switched_off)
                                           for tool in tools), id="mcp-tool-list")
            yield Static("Space switches the highlighted tool off or on: the model is offered only the tools "
                         "switched on. Each call asks first. Esc closes.", classes="dialog-hint")

    def _none_text(self) -> str:
        if self.config is None:
            return ("No MCP config: start mlxchat with --mcp-config FILE, or write ~/.config/mlxchat/mcp.json "
                    "(see docs/tools.md).")
        return f"{printable(self.config, limit=None)} names no MCP server, or they are still starting."

    def on_mount(self) -> None:
        lists = self.query(SelectionList)
        if lists:
            lists.first().focus()

    def action_close(self) -> None:
        lists = self.query(SelectionList)
        if not lists:
            self.dismiss(self.switched_off)
            return
        chosen = lists.first()
        on = set(chosen.selected)
        every = {chosen.get_option_at_index(i).value for i in range(chosen.option_count)}
        self.dismiss(frozenset(every - on))


def _line(tool: McpTool) -> str:
    description = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
    if len(description) > DESCRIPTION_SHOWN:
        description = description[:DESCRIPTION_SHOWN - 1] + "…"
    return printable(f"{tool.name} ({tool.server})" + (f": {description}" if description else ""), limit=None)
