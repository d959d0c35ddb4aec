"""The pairing rules of docs/serve.md (issue 63), each on each of the three APIs of a real `mlxchat serve` on a
loopback port: a conversation that ends with the assistant's message, a tool result that answers no call, a call
left without its result are each a 400 saying so, the same on OpenAI's chat and Responses APIs and Anthropic's
Messages API; a conversation that keeps the rules is answered on each."""

from __future__ import annotations

import pytest

from serve_process import MODEL, ServeProcess, http

pytestmark = pytest.mark.slow

ADD = {"name": "add", "description": "Add two integers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}
ASK = "What is 12 + 7?"
CALL = '{"a": 12, "b": 7}'

# Per API: its path, the fields of every request, and the messages (or items) of each conversation
CHAT = ("/v1/chat/completions",
        {"model": MODEL, "max_tokens": 4, "tools": [{"type": "function", "function": ADD}],
         "chat_template_kwargs": {"enable_thinking": False}},
        "messages", {
            "paired": [{"role": "user", "content": ASK},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "c1", "type": "function", "function": {"name": "add", "arguments": CALL}}]},
                       {"role": "tool", "tool_call_id": "c1", "content": "19"}],
            "trailing assistant": [{"role": "user", "content": ASK}, {"role": "assistant", "content": "It is"}],
            "result without call": [{"role": "user", "content": ASK},
                                    {"role": "tool", "tool_call_id": "c9", "content": "19"}],
            "call without result": [{"role": "user", "content": ASK},
                                    {"role": "assistant", "content": None, "tool_calls": [
                                        {"id": "c1", "type": "function",
                                         "function": {"name": "add", "arguments": CALL}}]},
                                    {"role": "user", "content": "And?"}]})
RESPONSES = ("/v1/responses",
             {"model": MODEL, "max_output_tokens": 4, "tools": [{"type": "function", **ADD}],
              "reasoning": {"effort": "none"}},
             "input", {
                 "paired": [{"role": "user", "content": ASK},
                            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": CALL},
                            {"type": "function_call_output", "call_id": "c1", "output": "19"}],
                 "trailing assistant": [{"role": "user", "content": ASK}, {"role": "assistant", "content": "It is"}],
                 "result without call": [{"role": "user", "content": ASK},
                                         {"type": "function_call_output", "call_id": "c9", "output": "19"}],
                 "call without result": [{"role": "user", "content": ASK},
                                         {"type": "function_call", "call_id": "c1", "name": "add", "arguments": CALL},
                                         {"role": "user", "content": "And?"}]})
MESSAGES = ("/v1/messages",
            {"model": MODEL, "max_tokens": 4, "thinking": {"type": "disabled"},
             "tools": [{"name": "add", "description": ADD["description"], "input_schema": ADD["parameters"]}]},
            "messages", {
                "paired": [{"role": "user", "content": ASK},
                           {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "add",
                                                              "input": {"a": 12, "b": 7}}]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                                         "content": "19"}]}],
                "trailing assistant": [{"role": "user", "content": ASK}, {"role": "assistant", "content": "It is"}],
                "result without call": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c9",
                                                                      "content": "19"}]}],
                "call without result": [{"role": "user", "content": ASK},
                                        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1",
                                                                           "name": "add", "input": {"a": 1}}]},
                                        {"role": "user", "content": "And?"}]})
APIS = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}
# What each rule's 400 says, the same on every API
SAYS = {"trailing assistant": "does not continue a reply", "result without call": "'c9' answers no call",
        "call without result": "'c1' (of add) have no results"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("pairing"), pair=("--model", MODEL, "--no-draft")) as running:
        yield running


def send(server: ServeProcess, api: str, conversation: str) -> tuple[int, dict]:
    path, fields, key, conversations = APIS[api]
    status, _, reply = http("POST", server.url + path, fields | {key: conversations[conversation]}, timeout=60)
    return status, reply


def message(reply: dict) -> str:
    return reply["error"]["message"]


@pytest.mark.parametrize("rule", list(SAYS))
@pytest.mark.parametrize("api", list(APIS))
def test_a_conversation_that_breaks_a_pairing_rule_is_a_400_saying_which(server, api, rule):
    status, reply = send(server, api, rule)
    assert status == 400 and SAYS[rule] in message(reply), reply


@pytest.mark.parametrize("api", list(APIS))
def test_a_conversation_that_keeps_the_rules_is_answered(server, api):
    status, reply = send(server, api, "paired")
    assert status == 200, reply
