"""A tiny MCP server for the window's tool tests, over stdio: a sum, a tool that fails, and one that hangs.

Written with the SDK's high-level server (FastMCP in mcp 1.x, renamed ``MCPServer`` in mcp 2).

Usage: python tests/mcp_server.py [--http PORT]   (stdio: an MCP client starts it; with ``--http`` it serves
Streamable HTTP at http://127.0.0.1:PORT/mcp). ``hang`` answers only after an hour. Each call
is written, as it starts, to the file named by MLXCHAT_TEST_MCP_LOG (when set): the tests see what ran.
"""

from __future__ import annotations

import json
import os
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("mlxchat-test-tools")


def _ran(name: str, **arguments) -> None:
    if log := os.environ.get("MLXCHAT_TEST_MCP_LOG"):
        with open(log, "a", encoding="utf-8") as file:
            file.write(json.dumps([name, arguments]) + "\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    _ran("add", a=a, b=b)
    return a + b


@server.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    _ran("divide", a=a, b=b)
    return a / b  # b = 0: the server reports the error to its client


@server.tool()
def hang(seconds: float = 3600.0) -> str:
    """Wait, then say so (a tool that does not answer in time)."""
    _ran("hang", seconds=seconds)
    time.sleep(seconds)
    return "done waiting"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run()
