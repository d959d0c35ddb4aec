"""The MCP config file, in the ``mcpServers`` format that Claude Desktop, Cursor and others read.

::

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
        "search": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ..."}}}}

A server with ``command`` runs as a child process spoken to over stdio (``args``,
``env``, ``cwd`` as given); one with ``url`` is reached over Streamable HTTP.
``timeout`` (seconds, default 60) bounds each tool call; ``"disabled": true``
leaves a server out; ``"alwaysAllow"`` (as Cline writes it) lists the server's
tools that run without asking, and the window adds a tool to it when the user
answers "always". SSE, the transport Streamable HTTP replaced, is refused by name.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mlxcore import MlxchatError

DEFAULT_CONFIG = Path("~/.config/mlxchat/mcp.json")
DEFAULT_TIMEOUT_S = 60.0
_HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")


class McpConfigError(MlxchatError):
    """The MCP config file cannot be read, or a server in it is not described well enough to start."""


@dataclass(frozen=True)
class ServerConfig:
    """One MCP server: a command to run (stdio) or a URL (Streamable HTTP)."""

    name: str
    command: str | None = None  # stdio: the program to start
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # added to the environment the server starts with
    cwd: str | None = None
    url: str | None = None  # Streamable HTTP: the server's endpoint
    headers: dict[str, str] = field(default_factory=dict)  # sent with every HTTP request (e.g. a token)
    timeout: float = DEFAULT_TIMEOUT_S  # seconds a tool call may take before the model gets an error
    always_allow: tuple[str, ...] = ()  # its tools that run without asking ("alwaysAllow")
    bundled: bool = False  # shipped with mlxchat (``--demo-tools``), not one of the config file's

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise McpConfigError(f"MCP server {self.name!r}: give either a \"command\" (stdio) or a \"url\" "
                                 "(Streamable HTTP)")
        if not self.timeout > 0:
            raise McpConfigError(f"MCP server {self.name!r}: \"timeout\" is seconds, more than 0, not {self.timeout}")

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


def read_config(path: str | Path) -> list[ServerConfig]:
    """The servers that ``path`` describes (``McpConfigError`` says what is wrong with it)."""
    path = Path(path).expanduser()
    servers = _read(path)["mcpServers"]
    return [server_config(name, entry) for name, entry in servers.items()
            if not (isinstance(entry, dict) and entry.get("disabled"))]


def server_config(name: str, entry: object) -> ServerConfig:
    """One ``mcpServers`` entry as a ServerConfig."""
    if not isinstance(entry, dict):
        raise McpConfigError(f"MCP server {name!r}: expected an object, not {entry!r}")
    kind = entry.get("type") or entry.get("transport")
    if kind == "sse":
        raise McpConfigError(f"MCP server {name!r}: SSE is not supported; use its Streamable HTTP endpoint")
    if kind not in (None, "stdio", *_HTTP_TYPES):
        raise McpConfigError(f"MCP server {name!r}: unknown type {kind!r} (stdio or http)")
    try:
        return ServerConfig(name=name, command=entry.get("command"), args=tuple(str(a) for a in entry.get("args", ())),
                            env={str(k): str(v) for k, v in entry.get("env", {}).items()}, cwd=entry.get("cwd"),
                            url=entry.get("url"), headers={str(k): str(v) for k, v in entry.get("headers", {}).items()},
                            timeout=float(entry.get("timeout", DEFAULT_TIMEOUT_S)),
                            always_allow=_names(name, entry.get("alwaysAllow", [])))
    except (TypeError, ValueError, AttributeError) as error:
        if isinstance(error, McpConfigError):
            raise
        raise McpConfigError(f"MCP server {name!r}: {error}") from None


def remember_always_allowed(path: str | Path, server: str, tool: str) -> None:
    """Add ``tool`` to ``server``'s ``alwaysAllow`` in the config file, everything else in it kept; the file is
    replaced whole (a crash leaves the old one). ``McpConfigError`` if it cannot be read or written."""
    path = Path(path).expanduser()
    data = _read(path)
    entry = data["mcpServers"].get(server)
    if not isinstance(entry, dict):
        raise McpConfigError(f"The MCP config {path} has no server {server!r} any more")
    allowed = list(_names(server, entry.get("alwaysAllow", [])))
    if tool in allowed:
        return
    entry["alwaysAllow"] = [*allowed, tool]
    temporary = None
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except OSError as error:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        raise McpConfigError(f"Cannot write the MCP config {path}: {error.strerror or error}") from None


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise McpConfigError(f"Cannot read the MCP config {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise McpConfigError(f"The MCP config {path} is not JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise McpConfigError(f'The MCP config {path} has no "mcpServers" object')
    return data


def _names(server: str, names: object) -> tuple[str, ...]:
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise McpConfigError(f'MCP server {server!r}: "alwaysAllow" is a list of tool names, not {names!r}')
    return tuple(names)


def demo_config() -> ServerConfig:
    """The bundled server of the embedded pair's three tools (``app.mcp.demo_server``), run by this Python."""
    return ServerConfig(name="demo", command=sys.executable, args=("-m", "app.mcp.demo_server"), bundled=True)


def default_config() -> Path | None:
    """``~/.config/mlxchat/mcp.json`` when it exists."""
    path = DEFAULT_CONFIG.expanduser()
    return path if path.is_file() else None
