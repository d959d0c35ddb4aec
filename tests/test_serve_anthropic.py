"""Anthropic's Messages API on `mlxchat serve`, through the official `anthropic` client against a real server.

One server (embedded pair) for the module. The replies are checked against the
chat endpoint's for the same conversation (greedy), since both are the same
request below the HTTP layer; usage and ``count_tokens`` against the prompt the
server builds.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from serve_process import MODEL, ServeProcess, http

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]
GREEDY = {"temperature": 0}  # the SDK's create() has no temperature argument: sent as an extra field
ON = {"type": "enabled", "budget_tokens": 1024}
OFF = {"type": "disabled"}
BILLING = "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli; cch={};"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-anthropic")) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.anthropic()


def blocks(reply) -> dict[str, str]:
    return {block.type: getattr(block, block.type) for block in reply.content}


def test_a_text_reply_with_usage(client):
    reply = client.messages.create(model=MODEL, max_tokens=200, messages=QUESTION, thinking=OFF)
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == MODEL and [b.type for b in reply.content] == ["text"]
    assert "19" in reply.content[0].text and "think>" not in reply.content[0].text
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    usage = reply.usage
    assert usage.input_tokens > 5 and usage.output_tokens > 3 and usage.cache_creation_input_tokens == 0


def test_greedy_text_equals_the_chat_endpoints(client, server):
    conversation = [{"role": "user", "content": "What is 12 + 7?"}, {"role": "assistant", "content": "19."},
                    {"role": "user", "content": "And 3 + 4?"}]
    for thinking in (False, True):
        chat = server.client().chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": "You answer briefly."}, *conversation],
            temperature=0, max_tokens=120, extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
        reply = client.messages.create(model=MODEL, max_tokens=120, system="You answer briefly.",
                                       messages=conversation, thinking=ON if thinking else OFF, extra_body=GREEDY)
        message = chat.choices[0].message
        assert blocks(reply).get("text") == message.content
        assert blocks(reply).get("thinking") == (message.reasoning_content if thinking else None)
        assert reply.usage.output_tokens == chat.usage.completion_tokens
        prompt = reply.usage.input_tokens + reply.usage.cache_read_input_tokens
        assert prompt == chat.usage.prompt_tokens


def test_thinking_on_gives_a_thinking_block_first(client):
    reply = client.messages.create(model=MODEL, max_tokens=300, messages=QUESTION, thinking=ON)
    assert [b.type for b in reply.content] == ["thinking", "text"]
    assert "2 + 7 = 9" in reply.content[0].thinking and "<think>" not in reply.content[0].thinking
    assert "19" in reply.content[1].text and "think>" not in reply.content[1].text
    off = client.messages.create(model=MODEL, max_tokens=300, messages=QUESTION, thinking=OFF)
    assert [b.type for b in off.content] == ["text"]


def test_an_earlier_replys_thinking_block_is_its_reasoning(client, server):
    """A thinking block sent back renders as the chat endpoint's reasoning_content: the same prompt."""
    first = client.messages.create(model=MODEL, max_tokens=300, messages=QUESTION, thinking=ON)
    turn = [*QUESTION, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": "And 3 + 4?"}]
    counted = client.messages.count_tokens(model=MODEL, messages=turn, thinking=OFF).input_tokens
    chat_turn = [*QUESTION, {"role": "assistant", "content": first.content[1].text,
                             "reasoning_content": first.content[0].thinking}, {"role": "user", "content": "And 3 + 4?"}]
    chat = server.client().chat.completions.create(model=MODEL, messages=chat_turn, max_tokens=1,
                                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert counted == chat.usage.prompt_tokens


def test_streaming_events_in_order_and_the_same_reply(client, server):
    whole = client.messages.create(model=MODEL, max_tokens=300, messages=QUESTION, thinking=ON, extra_body=GREEDY)
    status, _, text = http("POST", f"{server.url}/v1/messages", {"model": MODEL, "max_tokens": 300, "stream": True,
                                                                 "messages": QUESTION, "thinking": ON, **GREEDY})
    assert status == 200, text
    events = [(e.split("\n")[0].removeprefix("event: ").strip(), json.loads(e.split("data: ", 1)[1]))
              for e in text.replace("\r\n", "\n").split("\n\n") if e.startswith("event:")]
    assert all(name == data["type"] for name, data in events)
    kinds = [name for name, _ in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    starts = [data for name, data in events if name == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "thinking"), (1, "text")]
    thinking_end, text_start = kinds.index("content_block_stop"), kinds.index("content_block_start", 3)
    assert thinking_end == text_start - 1 and kinds.count("content_block_stop") == 2
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == whole.content[0].thinking
    assert "".join(d.get("text", "") for d in deltas) == whole.content[1].text
    end = events[-2][1]
    assert end["delta"]["stop_reason"] == "end_turn" and end["usage"]["output_tokens"] == whole.usage.output_tokens
    with client.messages.stream(model=MODEL, max_tokens=300, messages=QUESTION, thinking=ON,
                                extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert blocks(final) == blocks(whole) and final.stop_reason == "end_turn"


def test_count_tokens_is_the_prompt_the_server_builds(client):
    system = "You count tokens."
    counted = client.messages.count_tokens(model=MODEL, system=system, messages=QUESTION, thinking=OFF)
    reply = client.messages.create(model=MODEL, max_tokens=8, system=system, messages=QUESTION, thinking=OFF)
    assert counted.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    with_blocks = client.messages.count_tokens(model=MODEL, system=[{"type": "text", "text": system}],
                                               messages=[{"role": "user", "content": [
                                                   {"type": "text", "text": QUESTION[0]["content"]}]}], thinking=OFF)
    assert with_blocks.input_tokens == counted.input_tokens


def test_stop_sequences_end_the_reply_and_are_named(client):
    full = client.messages.create(model=MODEL, max_tokens=200, messages=QUESTION, thinking=OFF, extra_body=GREEDY)
    text = full.content[0].text
    stop = "7 ="
    assert stop in text
    cut = client.messages.create(model=MODEL, max_tokens=200, messages=QUESTION, thinking=OFF,
                                 stop_sequences=["never", stop], extra_body=GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[:text.index(stop)]
    with client.messages.stream(model=MODEL, max_tokens=200, messages=QUESTION, thinking=OFF,
                                stop_sequences=[stop], extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence, streamed.content[0].text) == \
        ("stop_sequence", stop, cut.content[0].text)


def test_max_tokens_ends_with_max_tokens(client):
    reply = client.messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 5


def test_cache_read_grows_turn_after_turn(client):
    system = "You are a patient tutor of arithmetic, and you answer with the sum only."
    messages: list[dict] = []
    reads, prompts = [], []
    for question in ("What is 12 + 7?", "And 3 + 4?", "And 20 + 22?", "And 5 + 5?"):
        messages.append({"role": "user", "content": question})
        reply = client.messages.create(model=MODEL, max_tokens=40, system=system, messages=messages, thinking=OFF)
        usage = reply.usage
        reads.append(usage.cache_read_input_tokens)
        prompts.append(usage.input_tokens + usage.cache_read_input_tokens)
        messages.append({"role": "assistant", "content": reply.content[0].text})
    assert reads[1:] == sorted(reads[1:]) and len(set(reads[1:])) == 3, f"cache reads {reads}"
    block = 16  # prefix hits are whole KV blocks
    for before, read in zip(prompts, reads[1:]):
        assert read >= block * (before // block), f"reads {reads} of prompts {prompts}"


def test_a_billing_header_block_does_not_defeat_the_prefix_cache(client):
    system = "You are mlxchat's test of Claude Code's billing header; answer in one line."

    def ask(tag: str):
        blocks_ = [{"type": "text", "text": BILLING.format(tag)}, {"type": "text", "text": system}]
        return client.messages.create(model=MODEL, max_tokens=16, system=blocks_, messages=QUESTION, thinking=OFF)

    first, second = ask("a1b2c"), ask("f9e8d")
    assert first.usage.cache_read_input_tokens == 0
    prompt = first.usage.input_tokens
    assert second.usage.cache_read_input_tokens >= 16 * ((prompt - 1) // 16) > 0, second.usage
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == prompt
    plain = client.messages.count_tokens(model=MODEL, system=system, messages=QUESTION, thinking=OFF)
    assert plain.input_tokens == prompt, "the header block is dropped, nothing else"


# --- errors, in Anthropic's shape


def refused(server, body: dict, status: int = 400) -> dict:
    got, _, reply = http("POST", f"{server.url}/v1/messages", body)
    assert got == status, reply
    assert reply["type"] == "error" and set(reply["error"]) == {"type", "message"}, reply
    return reply["error"]


def test_unknown_fields_and_bad_values_are_400_invalid_request(client, server):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=10, messages=QUESTION, extra_body={"frequency": 1})
    assert caught.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                            "message": caught.value.body["error"]["message"]}}
    assert "Unsupported field 'frequency'" in caught.value.body["error"]["message"]
    assert "Missing field 'max_tokens'" in refused(server, {"model": MODEL, "messages": QUESTION})["message"]
    error = refused(server, {"model": MODEL, "max_tokens": 5, "messages": QUESTION, "temperature": 1.5})
    assert error["type"] == "invalid_request_error" and "temperature" in error["message"]
    error = refused(server, {"model": MODEL, "max_tokens": 5,
                             "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})
    assert "messages.0.content.0" in error["message"] and "'image'" in error["message"]
    error = refused(server, {"model": MODEL, "max_tokens": 5,
                             "messages": [*QUESTION, {"role": "assistant", "content": "The answer is"}]})
    assert "prefill" in error["message"]
    assert refused(server, {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": QUESTION},
                   404)["type"] == "not_found_error"


def test_tools_build_the_chat_endpoints_prompt(client, server):
    """Tool calls themselves are tested on a scripted model (test_serve_anthropic_tools.py): the embedded pair
    calls none (its template shows no tools); here, the prompt with tools is the chat endpoint's with them."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    tool = {"name": "add", "description": "Adds two integers.", "input_schema": schema}
    counted = client.messages.count_tokens(model=MODEL, messages=QUESTION, tools=[tool], thinking=OFF).input_tokens
    chat = server.client().chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=1, extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        tools=[{"type": "function", "function": {"name": "add", "description": "Adds two integers.",
                                                 "parameters": schema}}])
    assert counted == chat.usage.prompt_tokens


CLOCK = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
         "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
FORCED_TOOLS = [{"name": "add", "description": "Adds.", "input_schema": ADD},
                {"name": "clock", "description": "The time.", "input_schema": CLOCK}]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "clock"}])
def test_tool_choice_any_and_tool_make_the_model_call(client, choice):
    """A grammar makes the call (the embedded pair was not trained to call tools): its input follows the schema."""
    ask = {"model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": "What time is it?"}],
           "tools": FORCED_TOOLS, "tool_choice": choice, "thinking": OFF}
    reply = client.messages.create(**ask)
    calls = [block for block in reply.content if block.type == "tool_use"]
    assert calls and reply.stop_reason == "tool_use", reply.content
    for call in calls:
        assert call.name == "clock" or choice["type"] == "any"
        jsonschema.validate(call.input, {"add": ADD, "clock": CLOCK}[call.name])
    with client.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content] == [b.type for b in reply.content]
    assert all(jsonschema.validate(b.input, {"add": ADD, "clock": CLOCK}[b.name]) is None
               for b in streamed.content if b.type == "tool_use")


def test_structured_output_gives_json_that_follows_the_schema(client):
    city = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                             "country": {"enum": ["FR", "DE", "IT"]}},
            "required": ["name", "country"], "additionalProperties": False}
    reply = client.messages.create(model=MODEL, max_tokens=200, thinking=OFF,
                                   messages=[{"role": "user", "content": "Describe a city."}],
                                   output_config={"format": {"type": "json_schema", "schema": city}})
    assert reply.stop_reason == "end_turn" and [b.type for b in reply.content] == ["text"]
    jsonschema.validate(json.loads(reply.content[0].text), city)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-anthropic-key"), api_key="sesame") as server:
        yield server


def test_both_key_headers_are_taken_and_a_wrong_key_is_401(keyed):
    for client in (keyed.anthropic(api_key="sesame"), keyed.anthropic(auth_token="sesame")):
        assert client.messages.count_tokens(model=MODEL, messages=QUESTION).input_tokens > 5
        assert client.messages.create(model=MODEL, max_tokens=4, messages=QUESTION).usage.output_tokens == 4
    for client in (keyed.anthropic(api_key="wrong"), keyed.anthropic(auth_token="wrong")):
        with pytest.raises(anthropic.AuthenticationError) as caught:
            client.messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
        assert caught.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                                "message": "Wrong API key."}}
    status, _, body = http("POST", f"{keyed.url}/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": QUESTION})
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert "x-api-key" in body["error"]["message"]
    assert keyed.client(api_key="sesame").models.list().data[0].id == MODEL, "OpenAI's routes take it as before"
    status, _, body = http("GET", f"{keyed.url}/v1/models", headers={"x-api-key": "sesame"})
    assert status == 200, body
