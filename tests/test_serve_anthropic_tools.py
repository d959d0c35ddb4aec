"""Tool calls through Anthropic's Messages API, with the official anthropic client on a loopback port.

The server is a real `mlxchat serve` whose picked tokens are scripted, as in
``test_serve_tools.py`` (which tests the chat endpoint the same way): asked about
a sum it writes a Qwen3 tool call; asked for two sums, two calls after a think
block; shown a tool's result it answers; asked for a broken call, it writes one
that is not JSON. The Messages API is a translation of the chat endpoint's
request, so these tests check the translation both ways: what the client sends
becomes the chat template's tool turns, and the parsed calls come back as
``tool_use`` blocks. (The Responses API's: ``test_serve_responses_tools.py``.)
"""

from __future__ import annotations

import json

import pytest
from serve_process import MODEL, http, scripted_server

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call>'
TWO = ('<think>\nTwo sums, two calls.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
       '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>')
BROKEN = 'Let me try. <tool_call>\n{"name": "add", "arguments": {"a": 12, "b": }\n</tool_call>'
RULES = [["<tool_response>", "The sum is 19."], ["two sums", TWO], ["broken", BROKEN], ["sum", CALL]]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
          "required": ["a", "b"]}
ANTHROPIC_TOOLS = [{"name": "add", "description": "Add two integers.", "input_schema": SCHEMA}]
SUM = "What is the sum of 12 and 7?"
PAIRS = "Do two sums: 1 + 2 and 3 + 4."
OFF, ON = {"type": "disabled"}, {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("anthropic-tools"), RULES) as running:
        yield running


def sse_events(text: str) -> list[dict]:
    return [json.loads(e.split("data: ", 1)[1]) for e in text.replace("\r\n", "\n").split("\n\n") if "data: " in e]


def ask_claude(server, messages, **fields):
    return server.anthropic().messages.create(model=MODEL, max_tokens=400, tools=ANTHROPIC_TOOLS, messages=messages,
                                              **fields)


def test_an_anthropic_tool_round_trip(server):
    messages = [{"role": "user", "content": SUM}]
    reply = ask_claude(server, messages, thinking=OFF)
    assert reply.stop_reason == "tool_use" and reply.stop_sequence is None
    [block] = reply.content
    assert block.type == "tool_use" and block.id.startswith("toolu_") and block.name == "add"
    assert block.input == {"a": 12, "b": 7}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "19"}]}]
    answer = ask_claude(server, messages, thinking=OFF)
    assert answer.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in answer.content] == [("text", "The sum is 19.")]
    counted = server.anthropic().messages.count_tokens(model=MODEL, tools=ANTHROPIC_TOOLS, messages=messages,
                                                       thinking=OFF)
    assert counted.input_tokens == answer.usage.input_tokens + answer.usage.cache_read_input_tokens
    assert answer.usage.cache_read_input_tokens > 0, "the turn after the call reads the conversation from the cache"


def test_anthropic_streams_each_call_as_a_tool_use_block(server):
    body = {"model": MODEL, "max_tokens": 400, "stream": True, "tools": ANTHROPIC_TOOLS, "thinking": ON,
            "messages": [{"role": "user", "content": PAIRS}]}
    status, _, text = http("POST", f"{server.url}/v1/messages", body)
    assert status == 200, text
    events = sse_events(text)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [s["type"] for s in starts] == ["thinking", "tool_use", "tool_use"]
    assert all(s["input"] == {} and s["id"].startswith("toolu_") and s["name"] == "add" for s in starts[1:])
    inputs = {}
    for e in events:
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            inputs[e["index"]] = inputs.get(e["index"], "") + e["delta"]["partial_json"]
    assert [json.loads(inputs[i]) for i in sorted(inputs)] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert sum(1 for e in events if e.get("delta", {}).get("type") == "input_json_delta") > 2, "several pieces"
    assert [e for e in events if e["type"] == "message_delta"][0]["delta"]["stop_reason"] == "tool_use"
    with server.anthropic().messages.stream(model=MODEL, max_tokens=400, tools=ANTHROPIC_TOOLS, thinking=ON,
                                            messages=[{"role": "user", "content": PAIRS}]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use", "tool_use"]
    assert [b.input for b in final.content[1:]] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert final.content[0].thinking.strip() == "Two sums, two calls." and final.stop_reason == "tool_use"


def test_anthropic_disable_parallel_tool_use_keeps_the_first_call(server):
    reply = ask_claude(server, [{"role": "user", "content": PAIRS}],
                       tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [b.input for b in reply.content if b.type == "tool_use"] == [{"a": 1, "b": 2}]
    assert reply.stop_reason == "tool_use"


def test_an_anthropic_call_that_does_not_parse_is_text(server):
    reply = ask_claude(server, [{"role": "user", "content": "A broken call, please."}], thinking=OFF)
    assert [(b.type, b.text) for b in reply.content] == [("text", BROKEN)] and reply.stop_reason == "end_turn"
    with server.anthropic().messages.stream(model=MODEL, max_tokens=400, tools=ANTHROPIC_TOOLS, thinking=OFF,
                                            messages=[{"role": "user", "content": "A broken call, please."}]) as s:
        final = s.get_final_message()  # no tool_use block whose JSON the SDK could not parse
    assert [(b.type, b.text) for b in final.content] == [("text", BROKEN)]


def test_anthropic_tool_results_render_as_tool_turns(server):
    """A tool_result (text blocks, is_error) is the chat endpoint's tool message; the same prompt."""
    call = {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 12, "b": 7}}
    result = {"type": "tool_result", "tool_use_id": "toolu_01", "is_error": True,
              "content": [{"type": "text", "text": "overflow"}]}
    messages = [{"role": "user", "content": SUM}, {"role": "assistant", "content": [call]},
                {"role": "user", "content": [result]}]
    counted = server.anthropic().messages.count_tokens(model=MODEL, tools=ANTHROPIC_TOOLS, messages=messages,
                                                       thinking=OFF).input_tokens
    called = {"id": "toolu_01", "type": "function", "function": {"name": "add", "arguments": '{"a": 12, "b": 7}'}}
    chat = server.client().chat.completions.create(
        model=MODEL, max_tokens=1, tools=[{"type": "function", "function": {
            "name": "add", "description": "Add two integers.", "parameters": SCHEMA}}],
        messages=[{"role": "user", "content": SUM}, {"role": "assistant", "content": None, "tool_calls": [called]},
                  {"role": "tool", "tool_call_id": "toolu_01", "content": "Error: overflow"}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert counted == chat.usage.prompt_tokens


def test_a_server_tool_is_a_clear_400(server):
    body = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": SUM}],
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]}
    status, _, reply = http("POST", f"{server.url}/v1/messages", body)
    assert status == 400 and reply["type"] == "error" and "server tool" in reply["error"]["message"], reply


def claude_code_request(messages: list[dict]) -> dict:
    """A request shaped as Claude Code sends it: billing header, cache marks, its tool schemas, metadata."""
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.40.a1; cch=5e0f1;"},
              {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
    tools = [{"name": "Bash", "description": "Run a command.", "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
        "properties": {"command": {"type": "string"}}, "required": ["command"]}},
        {**ANTHROPIC_TOOLS[0], "cache_control": {"type": "ephemeral"}}]
    return {"model": MODEL, "max_tokens": 32000, "temperature": 1, "stream": True, "system": system, "tools": tools,
            "messages": messages, "metadata": {"user_id": "user_abc_account__session_1"},
            "thinking": {"type": "enabled", "budget_tokens": 31999}}


def test_a_claude_code_shaped_turn_with_a_call_and_its_result(server):
    question = {"role": "user", "content": [{"type": "text", "text": PAIRS, "cache_control": {"type": "ephemeral"}}]}
    body = claude_code_request([question]) | {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    status, _, text = http("POST", f"{server.url}/v1/messages", body)
    assert status == 200, text
    events = sse_events(text)
    blocks = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    thinking = "".join(e["delta"].get("thinking", "") for e in events if e["type"] == "content_block_delta")
    arguments = "".join(e["delta"].get("partial_json", "") for e in events if e["type"] == "content_block_delta")
    assert [b["type"] for b in blocks] == ["thinking", "tool_use"] and json.loads(arguments) == {"a": 1, "b": 2}
    first_prompt = events[-2]["usage"]["input_tokens"] + events[-2]["usage"]["cache_read_input_tokens"]
    reply = {"role": "assistant", "content": [{"type": "thinking", "thinking": thinking, "signature": ""},
                                              blocks[1] | {"input": json.loads(arguments)}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": blocks[1]["id"], "content": "3"}]}
    status, _, text = http("POST", f"{server.url}/v1/messages", claude_code_request([question, reply, result]))
    events = sse_events(text)
    answer = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert answer == "The sum is 19."  # (the script answers every tool turn so)
    usage = events[-2]["usage"]
    assert usage["cache_read_input_tokens"] >= 16 * (first_prompt // 16), usage
