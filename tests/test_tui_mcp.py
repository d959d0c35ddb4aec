"""The chat window runs MCP tools, each call asked first: allow once, always, deny; a tool that hangs times out.

As users run it: the engine in its own process, the MCP server (``mcp_server.py``) a child started by the
window over stdio from an ``mcpServers`` config. The embedded pair calls only the three tools it learned
(``test_tui_demo_tools``), so here the engine's replies are scripted (``mcp_engine``: the batch runner's scripted masks, as in the ChatSession and
serve tool tests): a question gets a Qwen3 tool call, a tool's result gets an answer that depends on it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from app.mcp.config import read_config
from app.tui import engine_client
from app.tui.app import ChatApp
from app.tui.screens.mcp_tools import McpToolsScreen
from app.tui.screens.tool_approval import ToolApproval
from app.tui.widgets.message_view import MessageView
from mcp_engine import scripted_engine_process, use_script
from test_tui_helpers import SIZE, open_command, record_notes, wait_for, wait_ready

pytestmark = pytest.mark.slow
TIMEOUT_S = 3  # the server's tool-call limit in the config


def call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# the embedded template writes a result as Qwen3 does ("<tool_response>\n{result}\n</tool_response>" in a
# user turn); the first matching rule wins
RULES = [
    ("<tool_response>\n19\n<", "The sum is 19."),
    ("<tool_response>\nThe user denied", "You declined, so I did not add them."),
    ("<tool_response>\nError: hang did not answer", "The clock did not answer in time."),
    ("<tool_response>\n11\n<", "It is 11."),
    ("<tool_response>\n2\n<", "It is 2."),
    ("<tool_response>\nError: there is no tool 'divide'", "Division is switched off."),
    ("<tool_response>\nError: ", "The tool failed."),
    ("What is 12 + 7?", call("add", a=12, b=7)),
    ("And 3 + 4?", call("add", a=3, b=4)),
    ("What time is it?", call("hang")),
    ("And 5 + 6?", call("add", a=5, b=6)),
    ("And 1 + 1?", call("add", a=1, b=1)),
    ("Divide 1 by 0.", call("divide", a=1, b=0)),
]


@pytest.fixture(autouse=True)
def scripted(tmp_path, monkeypatch):
    use_script(tmp_path, monkeypatch, RULES)
    monkeypatch.setattr(engine_client, "run_engine_process", scripted_engine_process)


def mcp_app(tmp_path: Path, **open_changes) -> ChatApp:
    config = tmp_path / "mcp.json"
    server = Path(__file__).with_name("mcp_server.py")
    if not config.exists():  # (a window opened again reads what the first one kept in it)
        config.write_text(json.dumps({"mcpServers": {"calc": {
            "command": sys.executable, "args": [str(server)], "timeout": TIMEOUT_S,
            "env": {"MLXCHAT_TEST_MCP_LOG": str(tmp_path / "ran.jsonl")}}}}))
    # long enough for a call in the embedded pair's small vocabulary
    return ChatApp(open_command(max_tokens=200, **open_changes), mcp_servers=read_config(config),
                   mcp_config=str(config))


def ran(tmp_path: Path) -> list:
    log = tmp_path / "ran.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def ask(pilot, app: ChatApp, text: str) -> None:
    app.prompt.load_text(text)
    await pilot.press("enter")


async def approval(pilot, app: ChatApp) -> tuple[str, str, str]:
    await wait_for(pilot, lambda: isinstance(app.screen, ToolApproval), what="the approval")
    return app.screen.tool_name, app.screen.server, app.screen.arguments


async def answered(pilot, app: ChatApp, answer: str) -> None:
    await wait_for(pilot, lambda: app.state.messages[-1:] == (("assistant", answer),) and not app.generating
                   and not app.running_tools, what=f"the answer {answer!r}")


def test_the_window_asks_before_each_tool_call_and_the_chat_reopens_with_its_tool_turns(tmp_path):
    async def chat():
        app = mcp_app(tmp_path)
        seen = {}
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await wait_for(pilot, lambda: app.tools_ready, what="the MCP server's tools")
            await ask(pilot, app, "What is 12 + 7?")
            seen["asked"], seen["ran before allowing"] = await approval(pilot, app), ran(tmp_path)
            await pilot.press("a")  # allow once
            await answered(pilot, app, "The sum is 19.")
            await ask(pilot, app, "And 3 + 4?")
            seen["asked again"] = await approval(pilot, app)  # allowed once: asked again
            await pilot.press("d")  # deny
            await answered(pilot, app, "You declined, so I did not add them.")
            await ask(pilot, app, "What time is it?")
            await approval(pilot, app)
            await pilot.press("a")
            await answered(pilot, app, "The clock did not answer in time.")
            await ask(pilot, app, "And 5 + 6?")
            await approval(pilot, app)
            await pilot.press("y")  # always allow add
            await answered(pilot, app, "It is 11.")
            await ask(pilot, app, "And 1 + 1?")
            await answered(pilot, app, "It is 2.")  # no question this time
            seen["messages"], seen["session"] = app.state.messages, app.state.session_id
            seen["tool blocks"] = [view.call for view in app.query(MessageView) if view.role == "tool"]
        return seen

    async def reopen(session_id):
        app = mcp_app(tmp_path, session_id=session_id)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            reopened = app.state.messages, [view.call for view in app.query(MessageView) if view.role == "tool"]
            await wait_for(pilot, lambda: app.tools_ready, what="the MCP server's tools")
            await ask(pilot, app, "And 1 + 1?")
            await answered(pilot, app, "It is 2.")  # "always" was kept: no question in this window either
            return reopened

    seen = asyncio.run(chat())
    assert seen["asked"] == ("add", "calc", '{"a": 12, "b": 7}')
    assert seen["ran before allowing"] == [], "the arguments are shown before the tool runs"
    assert seen["asked again"] == ("add", "calc", '{"a": 3, "b": 4}')
    assert ran(tmp_path) == [["add", {"a": 12, "b": 7}], ["hang", {"seconds": 3600.0}], ["add", {"a": 5, "b": 6}],
                             ["add", {"a": 1, "b": 1}]], "the denied call did not run"
    results = [content for role, content in seen["messages"] if role == "tool"]
    timed_out = f"Error: hang did not answer within {TIMEOUT_S} s, and was given up."
    assert results[0] == "19" and results[2:] == [timed_out, "11", "2"]
    assert results[1].startswith("The user denied this call: add was not run.")
    assert [role for role, _ in seen["messages"]] == ["user", "assistant", "tool", "assistant"] * 5
    assert ("add", '{"a": 1, "b": 1}') in seen["tool blocks"], "each result is shown with the call it answers"
    assert read_config(tmp_path / "mcp.json")[0].always_allow == ("add",), "'always' is kept in the MCP config"
    messages, blocks = asyncio.run(reopen(seen["session"]))
    assert ran(tmp_path)[-1] == ["add", {"a": 1, "b": 1}]
    assert messages == seen["messages"], "the chat is saved with its tool turns"
    assert blocks and blocks == seen["tool blocks"][-len(blocks):], "(the window mounts the last messages only)"


def test_a_tool_switched_off_in_the_tools_screen_is_not_offered_and_a_call_to_it_gets_an_error(tmp_path):
    async def scenario():
        app = mcp_app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await wait_for(pilot, lambda: app.tools_ready, what="the MCP server's tools")
            await pilot.press("f4")
            await wait_for(pilot, lambda: isinstance(app.screen, McpToolsScreen), what="the tools screen")
            listed = [option.value for option in app.screen.query_one("#mcp-tool-list").options]
            await pilot.press("down", "space", "escape")  # the second tool, divide, off
            await wait_for(pilot, lambda: not isinstance(app.screen, McpToolsScreen), what="the chat")
            await ask(pilot, app, "Divide 1 by 0.")
            await answered(pilot, app, "Division is switched off.")
            return listed, app.switched_off, app.state.messages
    listed, off, messages = asyncio.run(scenario())
    assert listed == ["add", "divide", "hang"] and off == {"divide"}
    assert messages[-2][0] == "tool" and messages[-2][1].startswith("Error: there is no tool 'divide'")
    assert ran(tmp_path) == []


def test_a_tool_call_runs_on_a_kv_cache_that_is_not_paged_and_a_failing_tool_is_a_result(tmp_path):
    """Without the batching scheduler (``--kv standard``) a reply runs to its end before the next command:
    the calls and the reply after their results take that path too. A tool that raises gives the model an
    error result, and the chat goes on."""
    async def scenario():
        app = mcp_app(tmp_path, kv="standard")
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await wait_for(pilot, lambda: app.tools_ready, what="the MCP server's tools")
            await ask(pilot, app, "What is 12 + 7?")
            asked = await approval(pilot, app)
            await pilot.press("a")
            await answered(pilot, app, "The sum is 19.")
            await ask(pilot, app, "Divide 1 by 0.")
            await approval(pilot, app)
            await pilot.press("a")
            await answered(pilot, app, "The tool failed.")
            return asked, app.state.messages
    asked, messages = asyncio.run(scenario())
    assert asked == ("add", "calc", '{"a": 12, "b": 7}')
    assert [role for role, _ in messages] == ["user", "assistant", "tool", "assistant"] * 2 and messages[2][1] == "19"
    assert messages[6][1].startswith("Error: ") and "divide" in messages[6][1]
    assert ran(tmp_path) == [["add", {"a": 12, "b": 7}], ["divide", {"a": 1, "b": 0}]]


def test_the_chat_stays_on_screen_while_its_tool_runs(tmp_path):
    """A tool's result goes to the chat on screen: a new chat waits until the call is answered."""
    async def scenario():
        app = mcp_app(tmp_path)
        notes = record_notes(app)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await wait_for(pilot, lambda: app.tools_ready, what="the MCP server's tools")
            await ask(pilot, app, "What time is it?")
            await approval(pilot, app)
            await pilot.press("a")  # hang: runs until its timeout
            await wait_for(pilot, lambda: app.running_tools and not isinstance(app.screen, ToolApproval))
            session = app.state.session_id
            await pilot.press("ctrl+n")
            refused = app.state.session_id == session and any("tool calls wait" in note for note in notes)
            await answered(pilot, app, "The clock did not answer in time.")
            return refused, app.state.session_id == session
    refused, same = asyncio.run(scenario())
    assert refused and same
