"""Structured output through `mlxchat serve`, with real clients on a loopback port: the openai SDK's
``response_format`` (``json_schema`` with ``strict``, ``json_object``), ``tool_choice`` required and
named, and ``instructor`` with a pydantic model (its JSON-schema mode and its tools mode, which names
the function).

The server is the embedded pair as users run it (a lone reply decodes speculatively, so the grammar's
masks go through the draft rounds too); its model was not trained to answer in JSON, so a reply that
validates does so because of the grammar. Every string in the schemas is bounded (see
``structured_schemas.py``).
"""

from __future__ import annotations

import json
from typing import Literal

import instructor
import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field
from serve_process import MODEL, PAIR, ServeProcess
from structured_schemas import SCHEMAS

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "clock", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}}}]


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")  # (no other keys: their text would be unbounded)

    name: str = Field(max_length=12)
    country: Literal["FR", "DE", "IT"]
    population: int = Field(ge=0, le=10_000_000)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("structured"), pair=PAIR) as running:
        yield running


def chat(server, **kwargs):
    return server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a city."}], extra_body=NO_THINK,
        **{"max_tokens": 300, **kwargs})


@pytest.mark.parametrize("name", ["nested", "array_of_objects", "any_of_objects", "pattern"])
def test_a_json_schema_response_format_validates(server, name):
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    reply = chat(server, response_format=fmt)
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    stream = chat(server, response_format=fmt, stream=True, temperature=0.8, seed=5)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), schema)


def test_json_object_gives_an_object(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "deep", "schema": SCHEMAS["deep"]}}
    assert isinstance(json.loads(chat(server, response_format=fmt).choices[0].message.content), dict)
    reply = chat(server, response_format={"type": "json_object"}, max_tokens=40)
    text = reply.choices[0].message.content
    assert text.startswith("{")  # (an unbounded object may be cut at max_tokens: only its start is sure)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "clock"}}])
def test_a_forced_tool_choice_always_gives_a_valid_call(server, choice):
    reply = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What time is it?"}], tools=TOOLS, tool_choice=choice,
        max_tokens=200, extra_body=NO_THINK)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and message.tool_calls, message
    for call in message.tool_calls:
        if isinstance(choice, dict):
            assert call.function.name == "clock"
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_schema_the_grammar_cannot_compile_is_a_400_naming_the_construct(server):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}}
    with pytest.raises(openai.BadRequestError) as refused:
        chat(server, response_format=bad)
    assert "not" in str(refused.value) and "Unimplemented" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as refused:
        chat(server, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "not one of the tools" in str(refused.value)


@pytest.mark.parametrize("mode", [instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS], ids=["json_schema", "tools"])
def test_instructor_gets_a_pydantic_model(server, mode):
    client = instructor.from_openai(server.client(), mode=mode)
    city = client.chat.completions.create(model=MODEL, response_model=City, max_retries=0, max_tokens=200,
                                          messages=[{"role": "user", "content": "Name a city."}], extra_body=NO_THINK)
    assert isinstance(city, City)
