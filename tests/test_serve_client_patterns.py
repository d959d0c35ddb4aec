"""How clients really hold a conversation with `mlxchat serve`, through the official `openai` client.

The SDK's own multi-turn pattern appends the reply object as it came back
(``messages.append(reply.choices[0].message)``), which sends back its
``reasoning_content`` (thinking is on by default), or with ``model_dump()`` the
null fields of OpenAI's message (``refusal``, ``tool_calls``, ...). Both must
be taken, and the conversation so far must still come from the KV cache.
A restored session's messages must be sendable as they are.
"""

from __future__ import annotations

import openai
import pytest

from serve_process import MODEL, ServeProcess, assert_still_serves, http, normal_reply

SYSTEM = {"role": "system", "content": "You are a careful calculator. Show the steps of every sum, then give the "
                                       "result on a line of its own, and check it once more before you answer."}
TURNS = ["What is 347 + 589?", "And 12 + 7?", "And 25 + 17?"]
BLOCK = 16  # the KV pool's block: prefix hits count whole blocks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-client-patterns")) as server:
        yield server


@pytest.fixture(scope="module")
def reference(server):
    return normal_reply(server)


@pytest.fixture(autouse=True)
def still_serves(server, reference):
    """After each test; a test that restores a session says how many blocks it keeps pinned."""
    held = {"blocks": 0}
    yield held
    assert_still_serves(server, reference, held["blocks"])


@pytest.mark.parametrize("sent_back", ["object", "model_dump"])
def test_the_sdk_multi_turn_pattern_with_thinking_reuses_the_cache(server, sent_back):
    client = server.client()
    # not in the cache yet: the variant's name comes first, so that no block is shared with the other variant's
    messages: list = [{"role": "system", "content": f"({sent_back}) {SYSTEM['content']}"}]
    prompts, cached = [], []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=200)
        message = reply.choices[0].message
        assert message.reasoning_content, "thinking is on by default: the reply carries its reasoning"
        messages.append(message if sent_back == "object" else message.model_dump())
        prompts.append(reply.usage.prompt_tokens)
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
    if sent_back == "model_dump":
        assert {"refusal", "tool_calls", "function_call", "audio", "annotations"} <= set(messages[2])
    assert cached[0] == 0 and 0 < cached[1] < cached[2], f"cached tokens turn over turn: {cached}"
    # each turn finds the whole conversation before it in the cache (Qwen3 drops earlier think blocks)
    assert all(cached[i] > prompts[i - 1] - BLOCK for i in (1, 2)), (prompts, cached)


@pytest.mark.parametrize("field, value", [
    ("function_call", {"name": "f", "arguments": "{}"}),
    ("audio", {"id": "a1"}),
    ("refusal", "I cannot help with that."),
])
def test_a_reply_field_with_meaning_we_cannot_honour_is_400(server, field, value):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", field: value},
                {"role": "user", "content": "What is 12 + 7?"}]
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model=MODEL, messages=messages)
    assert caught.value.body["param"] == f"messages.1.{field}" and "not supported" in caught.value.body["message"]


def test_unknown_message_fields_stay_refused(server):
    messages = [{"role": "user", "content": "hi", "mood": "happy"}]
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model=MODEL, messages=messages)
    assert caught.value.body["param"] == "messages.0.mood"


def test_a_restored_thinking_session_is_sendable_as_is(server, still_serves):  # last: its blocks stay pinned
    client = server.client()
    messages: list = [SYSTEM, {"role": "user", "content": TURNS[0]}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=200)
    messages.append(reply.choices[0].message.model_dump(exclude_none=True))
    status, _, saved = http("POST", f"{server.url}/v1/sessions/x/save", {"messages": messages})
    assert status == 200, saved
    status, _, restored = http("POST", f"{server.url}/v1/sessions/x/restore")
    assert status == 200 and restored["enable_thinking"] is True, restored
    assert restored["messages"][-1]["reasoning_content"], "the reasoning comes back apart, as a chat reply gives it"
    still_serves["blocks"] = server.metrics()["mlxchat_pool_used_blocks"]
    again = client.chat.completions.create(model=MODEL, messages=restored["messages"] + [
        {"role": "user", "content": TURNS[1]}], max_tokens=200)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
