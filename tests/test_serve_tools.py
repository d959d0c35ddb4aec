"""Tool calls through `mlxchat serve`, with the official openai client on a loopback port.

The server is a real `mlxchat serve` process on the embedded target (no draft)
whose picked tokens are scripted (``tests/serve_scripted.py``): asked about a
sum it writes a Qwen3 tool call; asked for two sums, two calls in parallel after
a think block; shown a tool's result (a ``tool`` turn in its prompt) it answers;
asked for a broken call, it writes one that is not JSON. Everything else is
as users run it: the chat template, the scheduler, the parser, the HTTP side.
"""

from __future__ import annotations

import json

import openai
import pytest
from serve_process import MODEL, http, scripted_server

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call>'
TWO = ('<think>\nTwo sums, two calls.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
       '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>')
BROKEN = 'Let me try. <tool_call>\n{"name": "add", "arguments": {"a": 12, "b": }\n</tool_call>'
RULES = [["<tool_response>", "The sum is 19."], ["two sums", TWO], ["broken", BROKEN], ["sum", CALL]]
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("tools"), RULES) as running:
        yield running


def ask(server, messages, **kwargs):
    return server.client().chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0,
                                                   max_tokens=400, **kwargs)


def test_a_tool_round_trip_without_streaming(server):
    messages = [{"role": "user", "content": "What is the sum of 12 and 7?"}]
    reply = ask(server, messages, extra_body=NO_THINK)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 12, "b": 7}
    messages += [choice.message.model_dump(exclude_none=True),  # the SDK's own multi-turn pattern
                 {"role": "tool", "tool_call_id": call.id, "content": "19"}]
    answer = ask(server, messages, extra_body=NO_THINK).choices[0]
    assert answer.finish_reason == "stop" and answer.message.content == "The sum is 19."
    assert not answer.message.tool_calls


def test_parallel_calls_stream_the_name_first_then_the_arguments(server):
    stream = ask(server, [{"role": "user", "content": "Do two sums: 1 + 2 and 3 + 4."}], stream=True)
    calls: dict[int, dict] = {}
    pieces, finish, reasoning = 0, None, ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        finish = chunk.choices[0].finish_reason or finish
        for piece in delta.tool_calls or ():
            if piece.index not in calls:
                assert piece.id and piece.type == "function" and piece.function.name == "add", \
                    "a call's first piece carries its id, type and name"
                calls[piece.index] = {"id": piece.id, "arguments": ""}
            else:
                assert piece.id is None and piece.function.name is None
            calls[piece.index]["arguments"] += piece.function.arguments or ""
            pieces += 1
    assert finish == "tool_calls" and reasoning.strip() == "Two sums, two calls."
    assert [json.loads(c["arguments"]) for c in calls.values()] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert pieces > 4, "the arguments came in several pieces, as generated"
    assert len({c["id"] for c in calls.values()}) == 2


def test_parallel_tool_calls_false_ends_the_reply_after_the_first_call(server):
    reply = ask(server, [{"role": "user", "content": "Do two sums: 1 + 2 and 3 + 4."}], parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [json.loads(c.function.arguments) for c in choice.message.tool_calls] == [{"a": 1, "b": 2}]
    assert reply.usage.completion_tokens < len(TWO)  # it stopped generating there


def test_a_call_that_does_not_parse_reaches_the_client_as_text(server):
    for stream in (False, True):
        reply = ask(server, [{"role": "user", "content": "A broken call, please."}], extra_body=NO_THINK,
                    stream=stream)
        if stream:
            chunks = list(reply)
            content = "".join(c.choices[0].delta.content or "" for c in chunks)
            finish = chunks[-1].choices[0].finish_reason
        else:
            content, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
        assert content == BROKEN and finish == "stop"
    assert "cannot be read" in server.log()


def test_tool_choice_none_offers_no_tools_and_reads_no_calls(server):
    reply = ask(server, [{"role": "user", "content": "What is the sum of 12 and 7?"}], tool_choice="none",
                extra_body=NO_THINK)
    assert reply.choices[0].message.content == CALL and not reply.choices[0].message.tool_calls


def test_tool_messages_with_wrong_fields_are_400s(server):
    bad = [[{"role": "user", "content": "x", "tool_calls": [{"id": "1", "type": "function",
                                                            "function": {"name": "add", "arguments": "{}"}}]}],
           [{"role": "assistant", "content": None, "tool_calls": [
               {"id": "1", "type": "function", "function": {"name": "add", "arguments": "not json"}}]}],
           [{"role": "user", "content": "x", "tool_call_id": "1"}]]
    for messages in bad:
        with pytest.raises(openai.BadRequestError):
            ask(server, messages)


def test_saving_a_session_with_tool_calls_is_a_clear_400_not_a_loss(server):
    messages = [{"role": "user", "content": "sum"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    status, _, body = http("POST", f"{server.url}/v1/sessions/calls/save", {"messages": messages})
    assert status == 400 and "tool calls cannot be saved" in body["error"]["message"]
