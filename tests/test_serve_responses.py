"""OpenAI's Responses API on `mlxchat serve`, through the official `openai` client against a real server.

One server (embedded pair) for the module. Replies are checked against the chat
endpoint's for the same conversation (greedy): below the HTTP layer both are the
same request. Tool calls are in ``test_serve_responses_tools.py`` (a scripted model).
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from serve_process import MODEL, ServeProcess, http

QUESTION = "What is 12 + 7?"
OFF = {"effort": "none"}
ON = {"effort": "medium"}
BLOCK = 16  # prefix hits are whole KV blocks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-responses")) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def kinds(response) -> list[str]:
    return [item.type for item in response.output]


def reasoning_of(response) -> str | None:
    found = [item for item in response.output if item.type == "reasoning"]
    return "".join(part.text for part in found[0].content) if found else None


def test_a_text_response_with_usage(client):
    response = client.responses.create(model=MODEL, input=QUESTION, reasoning=OFF, max_output_tokens=200)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == MODEL
    assert response.status == "completed" and response.incomplete_details is None
    assert kinds(response) == ["message"] and response.output[0].role == "assistant"
    assert "19" in response.output_text and "think>" not in response.output_text
    usage = response.usage
    assert usage.input_tokens > 5 and usage.output_tokens > 3 and usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_reasoning_is_a_reasoning_item_first(client):
    response = client.responses.create(model=MODEL, input=QUESTION, reasoning=ON, max_output_tokens=300)
    assert kinds(response) == ["reasoning", "message"]
    assert "2 + 7 = 9" in reasoning_of(response) and "<think>" not in reasoning_of(response)
    assert "19" in response.output_text and response.usage.output_tokens_details.reasoning_tokens > 0


def test_greedy_text_equals_the_chat_endpoints(client):
    earlier = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "19."}]
    for thinking in (False, True):
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": "You answer briefly."}, *earlier,
                                   {"role": "user", "content": "And 3 + 4?"}],
            temperature=0, max_tokens=120, extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
        items = [earlier[0], {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "19."}]}, {"role": "user", "content": [
                {"type": "input_text", "text": "And 3 + 4?"}]}]
        response = client.responses.create(model=MODEL, instructions="You answer briefly.", input=items,
                                           temperature=0, max_output_tokens=120, reasoning=ON if thinking else OFF)
        message = chat.choices[0].message
        assert response.output_text == message.content
        assert reasoning_of(response) == (message.reasoning_content if thinking else None)
        assert response.usage.output_tokens == chat.usage.completion_tokens
        assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_streaming_events_in_order_and_the_same_response(client, server):
    whole = client.responses.create(model=MODEL, input=QUESTION, reasoning=ON, temperature=0, max_output_tokens=300)
    events = list(client.responses.create(model=MODEL, input=QUESTION, reasoning=ON, temperature=0,
                                          max_output_tokens=300, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    names = [e.type for e in events]
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert names[-1] == "response.completed"
    squeezed = [name for i, name in enumerate(names) if i == 0 or names[i - 1] != name]  # runs of deltas as one
    assert squeezed == ["response.created", "response.in_progress",
                        "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.done",
                        "response.output_item.done",
                        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
                        "response.output_text.done", "response.content_part.done", "response.output_item.done",
                        "response.completed"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert text == whole.output_text and thought == reasoning_of(whole)
    done = events[-1].response
    assert done.output_text == whole.output_text and done.usage.output_tokens == whole.usage.output_tokens
    assert [item.id for item in done.output] == [e.item.id for e in events if e.type == "response.output_item.done"]
    with client.responses.stream(model=MODEL, input=QUESTION, reasoning=ON, temperature=0,
                                 max_output_tokens=300) as stream:
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and reasoning_of(final) == reasoning_of(whole)
    status, head, raw = http("POST", f"{server.url}/v1/responses", {"model": MODEL, "input": QUESTION,
                                                                     "stream": True, "max_output_tokens": 8})
    assert status == 200 and "event: response.created" in raw, raw  # each event named by its type


def test_max_output_tokens_makes_it_incomplete(client):
    response = client.responses.create(model=MODEL, input=QUESTION, reasoning=OFF, max_output_tokens=5)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5
    events = list(client.responses.create(model=MODEL, input=QUESTION, reasoning=OFF, max_output_tokens=5,
                                          stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"


def test_cached_tokens_grow_turn_after_turn(client):
    items: list[dict] = []
    cached, prompts = [], []
    for question in ("What is 12 + 7?", "And 3 + 4?", "And 20 + 22?", "And 5 + 5?"):
        items.append({"role": "user", "content": question})
        response = client.responses.create(model=MODEL, instructions="You answer with the sum only.", input=items,
                                           reasoning=OFF, max_output_tokens=40)
        cached.append(response.usage.input_tokens_details.cached_tokens)
        prompts.append(response.usage.input_tokens)
        items += [item.model_dump(exclude_none=True) for item in response.output]  # the SDK's own pattern
    assert cached[1:] == sorted(cached[1:]) and len(set(cached[1:])) == 3, f"cached {cached}"
    for before, read in zip(prompts, cached[1:]):
        assert read >= BLOCK * (before // BLOCK), f"cached {cached} of prompts {prompts}"


# --- JSON and forced calls: grammars (the embedded model was not trained to write either)

CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                         "country": {"enum": ["FR", "DE", "IT"]},
                                         "population": {"type": "integer", "minimum": 0, "maximum": 10_000_000}},
        "required": ["name", "country", "population"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}},
    {"type": "function", "name": "clock", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}}]


def test_a_json_schema_text_format_gives_json_that_validates(client):
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}
    response = client.responses.create(model=MODEL, input="Describe a city.", text=fmt, reasoning=OFF,
                                       max_output_tokens=300)
    assert response.status == "completed" and response.text.format.type == "json_schema"
    jsonschema.validate(json.loads(response.output_text), CITY)
    events = list(client.responses.create(model=MODEL, input="Describe a city.", text=fmt, reasoning=OFF,
                                          max_output_tokens=300, temperature=0.8, stream=True, extra_body={"seed": 5}))
    jsonschema.validate(json.loads("".join(e.delta for e in events if e.type == "response.output_text.delta")), CITY)
    thought = client.responses.create(model=MODEL, input="Describe a city.", text=fmt, reasoning=ON,
                                      max_output_tokens=600)
    assert kinds(thought) == ["reasoning", "message"], thought.output  # the grammar holds after the thinking
    jsonschema.validate(json.loads(thought.output_text), CITY)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "clock"}])
def test_a_forced_tool_choice_gives_a_function_call(client, choice):
    response = client.responses.create(model=MODEL, input="What time is it?", tools=TOOLS, tool_choice=choice,
                                       reasoning=OFF, max_output_tokens=200)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and response.status == "completed", response.output
    for call in calls:
        assert call.name == "clock" or choice == "required"
        schema = next(tool["parameters"] for tool in TOOLS if tool["name"] == call.name)
        jsonschema.validate(json.loads(call.arguments), schema)


# --- errors, in OpenAI's shape


def test_previous_response_id_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=QUESTION, previous_response_id="resp_abc")
    assert "does not store responses" in caught.value.message
    assert caught.value.body["param"] == "previous_response_id"


def test_unknown_fields_bad_input_and_grammar_fields_are_400s(client, server):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=QUESTION, extra_body={"frequency": 1})
    assert "Unsupported field 'frequency'" in caught.value.message
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=image)
    assert "input.0" in caught.value.message and "input_image" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=QUESTION, text={"format": {
            "type": "json_schema", "name": "sum", "schema": {"type": "object", "not": {}}}})
    assert "not" in caught.value.message  # a schema the grammar cannot compile, named
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[]"}
    for body in ({"model": MODEL}, {"model": MODEL, "input": []}, {"model": MODEL, "input": QUESTION, "temperature": 3},
                 {"model": MODEL, "input": [call]}):
        status, _, reply = http("POST", f"{server.url}/v1/responses", body)
        assert status == 400 and reply["error"]["type"] == "invalid_request_error", reply
    status, _, reply = http("POST", f"{server.url}/v1/responses", {"model": "gpt-5", "input": QUESTION})
    assert status == 404 and reply["error"]["code"] == "model_not_found"


def test_the_models_list_is_openais_and_an_empty_codex_catalog(server):
    status, _, body = http("GET", f"{server.url}/v1/models?client_version=0.153.0")
    assert status == 200 and [entry["id"] for entry in body["data"]] == [MODEL]
    assert body["object"] == "list" and body["models"] == []  # Codex decodes it and uses its fallback metadata
