"""The window's MCP pieces without the window: the ``mcpServers`` file, and the hub against a real stdio server.

The server is ``mcp_server.py`` (the SDK's ``MCPServer``), started by the hub as a user's config starts one.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from serve_process import free_port, poll_until

from app.mcp.config import DEFAULT_TIMEOUT_S, McpConfigError, read_config, remember_always_allowed
from app.mcp import config as mcp_config
from app.mcp.hub import McpHub

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def config(tmp_path: Path, servers: dict) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def test_the_config_reads_stdio_and_http_servers_and_leaves_out_disabled_ones(tmp_path):
    servers = read_config(config(tmp_path, {
        "files": {"command": "npx", "args": ["-y", "server-filesystem", "/tmp"], "env": {"A": "1"}},
        "search": {"type": "http", "url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer x"},
                   "timeout": 5},
        "off": {"command": "x", "disabled": True}}))
    files, search = servers
    assert (files.name, files.transport, files.command, files.args, files.env) == (
        "files", "stdio", "npx", ("-y", "server-filesystem", "/tmp"), {"A": "1"})
    assert files.timeout == DEFAULT_TIMEOUT_S
    assert (search.transport, search.url, search.headers, search.timeout) == (
        "http", "http://127.0.0.1:8000/mcp", {"Authorization": "Bearer x"}, 5.0)


@pytest.mark.parametrize("servers, says", [
    ({"a": {"type": "sse", "url": "http://x"}}, "SSE is not supported"),
    ({"a": {"args": ["x"]}}, 'either a "command"'),
    ({"a": {"command": "x", "url": "http://x"}}, 'either a "command"'),
    ({"a": {"command": "x", "timeout": 0}}, '"timeout" is seconds'),
    ({"a": "npx"}, "expected an object"),
    ({"a": {"command": "x", "alwaysAllow": "add"}}, '"alwaysAllow" is a list'),
])
def test_a_server_described_wrongly_is_an_error_that_names_it(tmp_path, servers, says):
    with pytest.raises(McpConfigError, match=says) as error:
        read_config(config(tmp_path, servers))
    assert "'a'" in str(error.value)


def test_always_allowed_tools_are_read_and_a_new_one_is_kept_with_everything_else_in_the_file(tmp_path):
    path = config(tmp_path, {"calc": {"command": "x", "alwaysAllow": ["add"], "note": {"kept": [1, 2]}},
                             "other": {"url": "http://x", "disabled": True}})
    assert read_config(path)[0].always_allow == ("add",)
    remember_always_allowed(path, "calc", "divide")
    remember_always_allowed(path, "calc", "divide")  # once is enough
    assert json.loads(path.read_text()) == {"mcpServers": {
        "calc": {"command": "x", "alwaysAllow": ["add", "divide"], "note": {"kept": [1, 2]}},
        "other": {"url": "http://x", "disabled": True}}}
    assert read_config(path)[0].always_allow == ("add", "divide")
    assert [p.name for p in tmp_path.iterdir()] == ["mcp.json"], "no temporary file is left"


def test_an_always_allowed_tool_that_cannot_be_kept_says_why_and_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = config(tmp_path, {"calc": {"command": "x"}})
    with pytest.raises(McpConfigError, match="no server 'gone'"):
        remember_always_allowed(path, "gone", "add")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(mcp_config.os, "fsync", full)  # the disk fills as the new file is written
    with pytest.raises(McpConfigError, match="Cannot write the MCP config .*No space left"):
        remember_always_allowed(path, "calc", "add")
    assert json.loads(path.read_text()) == {"mcpServers": {"calc": {"command": "x"}}}, "the file is as it was"
    assert [p.name for p in tmp_path.iterdir()] == ["mcp.json"], "the unfinished copy is gone"


def test_always_for_a_demo_tool_beside_a_config_file_allows_it_in_the_window_and_leaves_the_file(tmp_path):
    """``--demo-tools`` with an MCP config file: the bundled server is not one of the file's, so "always" for
    its tool holds in the window, and neither writes the file nor warns that the file lacks the server."""
    from app.engine_host.protocol import Open
    from app.tui.app import ChatApp
    from app.tui.run import mcp_servers
    path = config(tmp_path, {"calc": {"command": "x"}})
    before = path.read_text()
    given, servers = mcp_servers(str(path), demo=True)
    assert [(s.name, s.bundled) for s in servers] == [("calc", False), ("demo", True)]
    warnings = []
    app = ChatApp(Open(model="mini-target"), mcp_servers=servers, mcp_config=given)  # not run: nothing starts
    app.notify = lambda message, **kwargs: warnings.append(message)
    app._always_allow("demo", "calculator")
    assert ("demo", "calculator") in app.always_allowed and warnings == []
    assert path.read_text() == before
    app._always_allow("calc", "add")  # a server of the file: kept there
    assert read_config(path)[0].always_allow == ("add",) and warnings == []


def test_a_config_that_is_not_there_or_not_json_says_so(tmp_path):
    with pytest.raises(McpConfigError, match="Cannot read"):
        read_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(McpConfigError, match="not JSON"):
        read_config(tmp_path / "bad.json")
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(McpConfigError, match='no "mcpServers"'):
        read_config(tmp_path / "empty.json")


def test_the_hub_lists_runs_and_times_out_tools_and_reports_a_server_that_fails(tmp_path):
    hub = McpHub(read_config(config(tmp_path, {
        "calc": {"command": sys.executable, "args": [SERVER], "timeout": 2},
        "broken": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]}})),
        log_path=str(tmp_path / "mcp.log"))
    try:
        calc, broken = hub.start().result(60)
        assert [tool.name for tool in calc.tools] == ["add", "divide", "hang"] and calc.error is None
        assert broken.tools == () and broken.error
        schema = calc.tools[0].schema()["function"]
        assert schema["name"] == "add" and schema["parameters"]["required"] == ["a", "b"]
        assert hub.call("add", {"a": 12, "b": 7}).result(30) == "19"
        assert hub.call("divide", {"a": 1, "b": 0}).result(30).startswith("Error:")
        started = time.monotonic()
        assert hub.call("hang", {}).result(30) == "Error: hang did not answer within 2 s, and was given up."
        assert time.monotonic() - started < 10
        assert hub.call("add", {"a": 1, "b": 1}).result(30) == "2", "the server still answers after a timeout"
        assert hub.call("nope", {}).result(30) == "Error: there is no tool 'nope' to run."
    finally:
        hub.close()


def test_the_hub_reaches_a_streamable_http_server(tmp_path):
    """With headers given, the hub makes the HTTP client that sends them."""
    port = free_port()
    server = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    hub = McpHub(read_config(config(tmp_path, {
        "web": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp", "headers": {"X-Test": "1"}, "timeout": 2}})))
    try:
        poll_until(lambda: _listening(port), limit=30)
        [web] = hub.start().result(60)
        assert web.error is None and web.transport == "http"
        assert [tool.name for tool in web.tools] == ["add", "divide", "hang"]
        assert hub.call("add", {"a": 12, "b": 7}).result(30) == "19"
        assert hub.call("hang", {}).result(30) == "Error: hang did not answer within 2 s, and was given up."
    finally:
        hub.close()
        server.kill()  # a graceful stop would wait for the hung call
        server.wait(10)


def _listening(port: int) -> bool:
    import socket
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_mlxchat_reads_the_config_given_or_the_default_one(tmp_path, monkeypatch):
    from app.cli import build_parser
    from app.tui.run import mcp_servers
    monkeypatch.setenv("HOME", str(tmp_path))
    assert mcp_servers(None) == (None, []), "no config: no servers"
    default = tmp_path / ".config" / "mlxchat" / "mcp.json"
    default.parent.mkdir(parents=True)
    default.write_text(json.dumps({"mcpServers": {"calc": {"command": "x"}}}))
    path, [server] = mcp_servers(None)
    assert path == str(default) and server.name == "calc"
    given = config(tmp_path, {"other": {"url": "http://127.0.0.1:1/mcp"}})
    args = build_parser().parse_args(["--mcp-config", str(given)])
    assert [s.name for s in mcp_servers(args.mcp_config)[1]] == ["other"]
