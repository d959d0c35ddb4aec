"""Connections to MCP servers, on an event loop of their own, and tool calls with a time limit.

The ``mcp`` SDK is async (anyio). The hub runs it on one asyncio loop in a
daemon thread, so neither the window's loop nor the engine ever waits on a
server: ``start`` and ``call`` return ``concurrent.futures.Future`` objects.
Each server is held open by one task (the SDK's contexts must be entered and
left in the same task) until ``close``. A server that cannot be reached is
reported in its ``ServerTools.error``; the others work on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from app.mcp.config import ServerConfig

if TYPE_CHECKING:  # the SDK loads when the hub connects, not when the window imports it
    from mcp import ClientSession
    from mcp.types import Result

CONNECT_TIMEOUT_S = 30.0  # starting a server and listing its tools
_SCHEMA_ORDER = ("type", "properties", "required")


@dataclass(frozen=True)
class McpTool:
    """A tool one server offers: the name the model sees, and the server's own name for it."""

    name: str  # unique across servers (``server__tool`` when two servers share a name)
    server: str
    remote_name: str
    description: str
    input_schema: dict[str, object]  # JSON Schema, passed on to the model as the server wrote it

    def schema(self) -> dict:
        """OpenAI's function-tool schema, as ChatSession offers tools to the model: the parameters' keys in
        the order clients write them (``type``, ``properties``, ``required``; the SDK's client sorts them)."""
        given = self.input_schema or {"type": "object", "properties": {}}
        first = [k for k in _SCHEMA_ORDER if k in given]
        parameters = {k: given[k] for k in first + [k for k in given if k not in _SCHEMA_ORDER]}
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": parameters}}


@dataclass(frozen=True)
class ServerTools:
    """What connecting to one server gave: its tools, or why there are none."""

    server: str
    transport: str  # "stdio" or "http"
    tools: tuple[McpTool, ...] = ()
    error: str | None = None


class McpHub:
    """The MCP servers of one window (see the module docstring)."""

    def __init__(self, servers: Sequence[ServerConfig], log_path: str | None = None) -> None:
        self.servers = {server.name: server for server in servers}
        # a stdio server's stderr: the terminal belongs to the window
        self.log_path = log_path or os.path.join(tempfile.gettempdir(), f"mlxchat-mcp-{os.getpid()}.log")
        self.tools: dict[str, McpTool] = {}
        self._sessions: dict[str, ClientSession] = {}  # by server name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mlxchat-mcp", daemon=True)
        self._stop: asyncio.Event | None = None
        self._holders: list[asyncio.Task[None]] = []
        self._log: TextIO | None = None  # stdio servers' stderr, open from start to close
        self._started = False

    def start(self) -> Future[list[ServerTools]]:
        """Connect to every server and list its tools (each within CONNECT_TIMEOUT_S)."""
        if not self._started:
            self._started = True
            self._log = open(self.log_path, "a", encoding="utf-8")  # stdio servers write there while the hub lives
            self._thread.start()
        return asyncio.run_coroutine_threadsafe(self._connect_all(), self._loop)

    def call(self, name: str, arguments: dict[str, object]) -> Future[str]:
        """Run tool ``name``; the future's result is the text the model reads. A failure, a server error or
        a call past the server's ``timeout`` is a result too (starting "Error:"), never an exception."""
        return asyncio.run_coroutine_threadsafe(self._call(name, arguments), self._loop)

    def close(self, timeout: float = 5.0) -> None:
        """Leave every server (stdio ones end) and stop the loop."""
        if not self._started or self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._leave(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if self._log is not None:
            self._log.close()

    # on the hub's loop ------------------------------------------------------------------

    async def _connect_all(self) -> list[ServerTools]:
        self._stop = asyncio.Event()
        found = await asyncio.gather(*(self._connect(server) for server in self.servers.values()))
        taken: set[str] = set()
        for listed in found:
            for tool in listed.tools:
                name = tool.name if tool.name not in taken else f"{tool.server}__{tool.remote_name}"
                taken.add(name)
                self.tools[name] = McpTool(name, tool.server, tool.remote_name, tool.description, tool.input_schema)
        return [ServerTools(s.server, s.transport, tuple(t for t in self.tools.values() if t.server == s.server),
                            s.error) for s in found]

    async def _connect(self, server: ServerConfig) -> ServerTools:
        ready: asyncio.Future[ClientSession] = self._loop.create_future()
        self._holders.append(asyncio.create_task(self._hold(server, ready)))
        try:
            session = await asyncio.wait_for(asyncio.shield(ready), CONNECT_TIMEOUT_S)
            listed = await asyncio.wait_for(session.list_tools(), CONNECT_TIMEOUT_S)
        except asyncio.TimeoutError:
            return ServerTools(server.name, server.transport, error=f"no answer within {CONNECT_TIMEOUT_S:.0f} s")
        except Exception as error:  # noqa: BLE001  one server's failure is reported, the others go on
            return ServerTools(server.name, server.transport, error=_reason(error))
        self._sessions[server.name] = session
        tools = tuple(McpTool(t.name, server.name, t.name, t.description or "", dict(t.input_schema or {}))
                      for t in listed.tools)
        return ServerTools(server.name, server.transport, tools)

    async def _hold(self, server: ServerConfig, ready: asyncio.Future[ClientSession]) -> None:
        """Open the server's connection, hand its session over, and keep it open until ``close``."""
        assert self._stop is not None  # _connect_all made it before connecting
        try:
            async with contextlib.AsyncExitStack() as stack:
                session = await self._open(server, stack)
                await session.initialize()
                ready.set_result(session)
                await self._stop.wait()
        except BaseException as error:  # noqa: BLE001  told to whoever waits for the connection
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else ConnectionError(str(error)))
            if isinstance(error, asyncio.CancelledError):
                raise
        finally:
            self._sessions.pop(server.name, None)

    async def _open(self, server: ServerConfig, stack: contextlib.AsyncExitStack) -> ClientSession:
        """``server``'s session, over its transport, both left when ``stack`` closes."""
        from mcp import ClientSession
        if server.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client
            assert self._log is not None  # start opened it
            transport = stdio_client(StdioServerParameters(command=server.command, args=list(server.args),
                                                           env=server.env or None, cwd=server.cwd), errlog=self._log)
        else:
            from mcp.client.streamable_http import streamable_http_client
            assert server.url is not None  # ServerConfig has a command or a url
            client = None
            if server.headers:
                from mcp.shared._httpx_utils import create_mcp_http_client
                client = await stack.enter_async_context(create_mcp_http_client(headers=server.headers))
            transport = streamable_http_client(server.url, http_client=client)
        read, write = await stack.enter_async_context(transport)
        return await stack.enter_async_context(ClientSession(read, write))

    async def _call(self, name: str, arguments: dict[str, object]) -> str:
        tool = self.tools.get(name)
        session = self._sessions.get(tool.server) if tool is not None else None
        if tool is None or session is None:
            return f"Error: there is no tool {name!r} to run" + (" (its server is not connected)." if tool else ".")
        limit = self.servers[tool.server].timeout
        try:
            result = await asyncio.wait_for(session.call_tool(tool.remote_name, arguments), limit)
        except asyncio.TimeoutError:
            return f"Error: {name} did not answer within {limit:g} s, and was given up."
        except Exception as error:  # noqa: BLE001  the model reads it and the chat goes on
            return f"Error: {name} failed: {_reason(error)}"
        text = result_text(result)
        return f"Error: {text}" if getattr(result, "is_error", False) else text

    async def _leave(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._holders:
            await asyncio.wait(self._holders, timeout=3.0)
        for task in self._holders:
            task.cancel()


def result_text(result: Result) -> str:
    """A CallToolResult as the text the model reads: its text parts, else its structured content (another
    result, which asks for input this client does not give: no text)."""
    from mcp.types import CallToolResult, TextContent
    if not isinstance(result, CallToolResult):
        return ""
    parts = [block.text if isinstance(block, TextContent) else f"[{block.type} not shown to the model]"
             for block in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _reason(error: BaseException) -> str:
    """An exception as one line; an exception group (anyio's) as its first inner error."""
    inner = getattr(error, "exceptions", None)  # an exception group's (anyio's; Python 3.10 has no builtin type)
    while isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
        error = inner[0]
        inner = getattr(error, "exceptions", None)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
