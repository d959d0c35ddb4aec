"""Tool calls through OpenAI's Responses API, with the official openai client on a loopback port.

The server is a real `mlxchat serve` whose picked tokens are scripted, as in
``test_serve_tools.py`` (which tests the chat endpoint the same way): asked about
a sum it writes a Qwen3 tool call; asked for two sums, two calls after a think
block; shown a tool's result it answers; asked for a broken call, it writes one
that is not JSON. The Responses API is a translation of the chat endpoint's
request: function tools and items go in as the chat endpoint's tools and tool
turns, the parsed calls come back as ``function_call`` items.
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
RESPONSES_TOOLS = [{"type": "function", "name": "add", "description": "Add two integers.", "parameters": SCHEMA}]
SUM = "What is the sum of 12 and 7?"
PAIRS = "Do two sums: 1 + 2 and 3 + 4."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("responses-tools"), RULES) as running:
        yield running


def respond(server, items, **fields):
    return server.client().responses.create(model=MODEL, input=items, tools=RESPONSES_TOOLS, max_output_tokens=400,
                                            **fields)


def test_a_responses_function_call_round_trip(server):
    items = [{"role": "user", "content": SUM}]
    response = respond(server, items, reasoning={"effort": "none"})
    [call] = response.output
    assert call.type == "function_call" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert call.name == "add" and json.loads(call.arguments) == {"a": 12, "b": 7} and call.status == "completed"
    assert response.status == "completed"
    items += [item.model_dump(exclude_none=True) for item in response.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "19"})
    answer = respond(server, items, reasoning={"effort": "none"})
    assert answer.output_text == "The sum is 19." and [i.type for i in answer.output] == ["message"]
    assert answer.usage.input_tokens_details.cached_tokens > 0


def test_responses_stream_each_call_as_an_item(server):
    events = list(respond(server, [{"role": "user", "content": PAIRS}], reasoning={"effort": "high"}, stream=True))
    names = [e.type for e in events]
    squeezed = [name for i, name in enumerate(names) if i == 0 or names[i - 1] != name]
    call_events = ["response.output_item.added", "response.function_call_arguments.delta",
                   "response.function_call_arguments.done", "response.output_item.done"]
    assert squeezed == ["response.created", "response.in_progress", "response.output_item.added",
                        "response.reasoning_text.delta", "response.reasoning_text.done", "response.output_item.done",
                        *call_events, *call_events, "response.completed"]
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(i.type, getattr(i, "arguments", None)) for i in added] == [("reasoning", None), ("function_call", ""),
                                                                       ("function_call", "")]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    for e in done:
        pieces = [d.delta for d in events
                  if d.type == "response.function_call_arguments.delta" and d.item_id == e.item_id]
        assert "".join(pieces) == e.arguments
    final = events[-1].response
    assert [i.type for i in final.output] == ["reasoning", "function_call", "function_call"]
    with server.client().responses.stream(model=MODEL, input=PAIRS, tools=RESPONSES_TOOLS,
                                          max_output_tokens=400) as stream:
        streamed = stream.get_final_response()
    assert [json.loads(i.arguments) for i in streamed.output if i.type == "function_call"] == \
        [{"a": 1, "b": 2}, {"a": 3, "b": 4}]


def test_responses_parallel_tool_calls_false_keeps_the_first_call(server):
    response = respond(server, PAIRS, parallel_tool_calls=False)
    assert [json.loads(i.arguments) for i in response.output if i.type == "function_call"] == [{"a": 1, "b": 2}]
    assert response.parallel_tool_calls is False


def test_responses_drop_tool_types_other_than_function_and_say_so(server):
    tools = [*RESPONSES_TOOLS, {"type": "web_search"}, {"type": "local_shell"},
             {"type": "custom", "name": "apply_patch", "description": "Patch files."}]
    raw = server.client().responses.with_raw_response.create(model=MODEL, input=SUM, tools=tools,
                                                             reasoning={"effort": "none"}, max_output_tokens=400)
    assert raw.headers["x-mlxchat-dropped-tools"] == "custom, local_shell, web_search"
    assert [i.type for i in raw.parse().output] == ["function_call"]
    assert "not offered to the model" in server.log()


def test_a_responses_call_that_does_not_parse_is_text(server):
    response = respond(server, "A broken call, please.", reasoning={"effort": "none"})
    assert [i.type for i in response.output] == ["message"] and response.output_text == BROKEN
    events = list(respond(server, "A broken call, please.", reasoning={"effort": "none"}, stream=True))
    assert not any(e.type.startswith("response.function_call") for e in events)
    assert events[-1].response.output_text == BROKEN


def test_responses_tool_choice_none_offers_no_tools(server):
    response = respond(server, SUM, tool_choice="none", reasoning={"effort": "none"})
    assert response.output_text == CALL and [i.type for i in response.output] == ["message"]


def codex_request(items: list[dict]) -> dict:
    """A request shaped as Codex sends it to a custom provider (its ResponsesApiRequest): every field set."""
    return {"model": MODEL, "instructions": "You are a coding agent.", "input": items,
            "tools": [*RESPONSES_TOOLS, {"type": "web_search", "external_web_access": False},
                      {"type": "custom", "name": "apply_patch", "description": "Patch files.",
                       "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}],
            "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
            "store": False, "stream": True, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "0199a213-81c0-7800-8aa1-bbab2a035a53", "text": {"verbosity": "medium"},
            "client_metadata": {"x-codex-turn": "1"}}


def streamed_items(server, body: dict) -> tuple[list[dict], dict]:
    """The items of ``response.output_item.done`` events, as Codex keeps them (no ids), and the final response."""
    status, _, text = http("POST", f"{server.url}/v1/responses", body)
    assert status == 200, text
    events = [json.loads(e.split("data: ", 1)[1]) for e in text.replace("\r\n", "\n").split("\n\n") if "data: " in e]
    items = [{k: v for k, v in e["item"].items() if k not in ("id", "status")} for e in events
             if e["type"] == "response.output_item.done"]
    return items, events[-1]


def test_a_codex_shaped_turn_with_a_call_and_its_output(server):
    user = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."}]}
    question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PAIRS}]}
    items, last = streamed_items(server, codex_request([user, question]))
    assert last["type"] == "response.completed"
    first_prompt = last["response"]["usage"]["input_tokens"]
    assert [item["type"] for item in items] == ["reasoning", "function_call"]  # one call: parallel_tool_calls false
    reasoning, call = items
    assert reasoning["content"][0]["text"].strip() == "Two sums, two calls." and reasoning["summary"] == []
    assert json.loads(call["arguments"]) == {"a": 1, "b": 2}
    sent_back = [reasoning | {"encrypted_content": None}, call]  # Codex writes the empty field as null
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "3"}
    items, last = streamed_items(server, codex_request([user, question, *sent_back, output]))
    # (the script answers every tool turn so)
    assert [item["type"] for item in items] == ["message"] and items[0]["content"][0]["text"] == "The sum is 19."
    usage = last["response"]["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= 16 * (first_prompt // 16), usage

