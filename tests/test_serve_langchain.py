"""LangChain's ``ChatOpenAI.bind_tools`` against a real ``mlxchat serve``: a whole tool round trip.

The server is ``serve_scripted.py`` on the embedded target (no draft), whose picked tokens are scripted as
in ``test_serve_tools.py``: asked about a sum it writes a Qwen3 tool call; shown the tool's result it
answers. LangChain builds the request (its tool schema from a Python function, the tool message with the
call's id), sends it with the openai SDK and reads the reply as its users do.
"""

from __future__ import annotations


import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from serve_process import MODEL, scripted_server

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call>'
RULES = [["<tool_response>", "The sum is 19."], ["sum", CALL]]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("langchain"), RULES) as running:
        yield running


@pytest.mark.parametrize("streaming", [False, True])
def test_bind_tools_completes_a_tool_round_trip(server, streaming):
    model = ChatOpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key="none", temperature=0, max_tokens=400,
                       max_retries=0, timeout=60, streaming=streaming,
                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    with_tools = model.bind_tools([add])
    messages = [HumanMessage("What is the sum of 12 and 7?")]
    asked = with_tools.invoke(messages)
    assert [(call["name"], call["args"]) for call in asked.tool_calls] == [("add", {"a": 12, "b": 7})]
    assert asked.response_metadata.get("finish_reason") == "tool_calls"
    [call] = asked.tool_calls
    messages += [asked, ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"])]
    answer = with_tools.invoke(messages)
    assert answer.content == "The sum is 19." and not answer.tool_calls
