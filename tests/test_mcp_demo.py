"""The bundled MCP server of the embedded pair's tools (``mlxchat --demo-tools``), spoken to across a real
stdio process boundary by the window's MCP hub."""

from __future__ import annotations

import json

import pytest

from app.cli import build_parser
from app.mcp import demo_tools
from app.mcp.config import demo_config
from app.mcp.hub import McpHub
from app.tui.run import mcp_servers


@pytest.fixture(scope="module")
def hub():
    hub = McpHub([demo_config()])
    (listed,) = hub.start().result(60)
    assert listed.error is None, listed.error
    yield hub
    hub.close()


def test_the_model_is_offered_the_schemas_it_trained_on_word_for_word(hub):
    offered = {name: tool.schema() for name, tool in hub.tools.items()}
    assert list(offered) == ["calculator", "get_time", "convert_units"]
    for name, schema in offered.items():
        assert json.dumps(schema) == json.dumps(demo_tools.TOOLS[name]), "same keys, same order: same prompt text"


def test_each_tool_answers_as_the_recipe_taught_and_a_bad_call_is_an_error_result(hub):
    assert json.loads(hub.call("calculator", {"expression": "417 * 386"}).result(30)) == {"result": 160962}
    assert hub.call("convert_units", {"value": 26, "from": "miles", "to": "kilometers"}).result(30) == \
        '{"value": 41.84, "unit": "kilometers"}'
    now = json.loads(hub.call("get_time", {}).result(30))
    assert set(now) == {"date", "time", "weekday"} and len(now["time"]) == 5
    refused = hub.call("calculator", {"expression": "__import__('os')"}).result(30)
    assert "integers with +, - and *" in refused
    assert "no conversion from parsecs to miles" in \
        hub.call("convert_units", {"value": 1, "from": "parsecs", "to": "miles"}).result(30)


def test_demo_tools_adds_the_bundled_server_after_the_config_files_servers(tmp_path):
    assert build_parser().parse_args(["--demo-tools"]).demo_tools and not build_parser().parse_args([]).demo_tools
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"files": {"command": "true"}}}))
    path, servers = mcp_servers(str(config), demo=True)
    assert path == str(config) and [s.name for s in servers] == ["files", "demo"]
    assert servers[1].args == ("-m", "app.mcp.demo_server")
    assert mcp_servers(str(config))[1][-1].name == "files", "offered only when asked for"


def test_a_clock_given_is_what_get_time_reports():
    clock = demo_tools.Clock("2026-11-26", "14:05", "Thursday")
    assert json.loads(demo_tools.run("get_time", {}, clock)) == {"date": "2026-11-26", "time": "14:05",
                                                                 "weekday": "Thursday"}
    with pytest.raises(ValueError, match="no tool named"):
        demo_tools.run("weather", {})
