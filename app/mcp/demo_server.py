"""An MCP server over stdio offering the embedded pair's three tools (``demo_tools``): the offline
demonstration of tool calls in the window (``mlxchat --demo-tools`` starts it as ``python -m
app.mcp.demo_server``).

Written on the SDK's low-level server: its tools are listed with the schemas the pair trained on, word
for word (the high-level server writes its own from type hints, and ``from`` cannot be a parameter).
"""

from __future__ import annotations

import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import (CallToolRequestParams, CallToolResult, ListToolsResult, PaginatedRequestParams, TextContent,
                       Tool)

from app.mcp import demo_tools

NAME = "mlxchat-demo"


async def list_tools(ctx: object, params: PaginatedRequestParams | None) -> ListToolsResult:
    return ListToolsResult(tools=[Tool(name=name, description=tool["function"]["description"],
                                       input_schema=tool["function"]["parameters"])
                                  for name, tool in demo_tools.TOOLS.items()])


async def call_tool(ctx: object, params: CallToolRequestParams) -> CallToolResult:
    try:
        text, failed = demo_tools.run(params.name, dict(params.arguments or {})), False
    except ValueError as error:  # the model reads why, and may call again
        text, failed = str(error), True
    return CallToolResult(content=[TextContent(text=text)], is_error=failed)


server = Server(NAME, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve_stdio)
