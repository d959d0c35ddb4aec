"""The offline demonstration of tool calls: in the window, the embedded pair, nothing scripted, calls a tool of
the bundled demo server (``mlxchat --demo-tools``), the user allows the call, and the pair answers from the
tool's result. As users run it: the engine in its own process, the MCP server a child over stdio."""

from __future__ import annotations

import asyncio

import pytest

from app.mcp.config import demo_config
from app.tui.app import ChatApp
from app.tui.screens.tool_approval import ToolApproval
from app.tui.widgets.message_view import MessageView
from test_tui_helpers import SIZE, open_command, wait_for, wait_ready

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("think", [True, False])
def test_the_embedded_pair_calls_the_calculator_in_the_window_and_answers_from_its_result(tmp_path, monkeypatch,
                                                                                          think):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))

    async def chat():
        app = ChatApp(open_command(max_tokens=200, think=think), mcp_servers=[demo_config()])
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await wait_for(pilot, lambda: app.tools_ready, what="the demo server's tools")
            app.prompt.load_text("What is 417 * 386?")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, ToolApproval), what="the approval")
            asked = app.screen.tool_name, app.screen.server, app.screen.arguments
            await pilot.press("a")  # allow once
            await wait_for(pilot, lambda: len(app.state.messages) == 4 and not app.generating
                           and not app.running_tools, what="the answer")
            blocks = [view.call for view in app.query(MessageView) if view.role == "tool"]
            return asked, app.state.messages, blocks

    asked, messages, blocks = asyncio.run(chat())
    assert asked == ("calculator", "demo", '{"expression": "417 * 386"}'), "the pair's own call, shown before it runs"
    assert [role for role, _ in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2][1] == '{"result": 160962}', "the bundled server ran it"
    assert messages[3][1].split("</think>")[-1].strip() == "417 × 386 = 160962.", "answered from the result"
    assert blocks == [("calculator", '{"expression": "417 * 386"}')]
