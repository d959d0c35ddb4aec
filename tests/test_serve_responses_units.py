"""OpenAI's Responses API translated at the edge, without a server: what the chat endpoint is asked."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.serve.errors import APIError
from app.serve.responses_schemas import ResponsesRequest
from app.serve.responses_translate import translate

ADD = {"type": "function", "name": "add", "description": "Adds.", "parameters": {"type": "object"}}


def chat(**fields):
    return translate(ResponsesRequest.model_validate({"model": "m", "input": "What is 12 + 7?"} | fields)).chat


def as_chat(items, **fields) -> list[dict]:
    return [m.as_dict() for m in chat(input=items, **fields).messages]


def test_a_string_input_is_a_user_message_after_the_instructions():
    assert as_chat("Hi.", instructions="Be brief.") == [{"role": "system", "content": "Be brief."},
                                                        {"role": "user", "content": "Hi."}]


def test_one_replys_reasoning_text_and_calls_are_one_assistant_message():
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'}
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Sum"}, {"type": "input_text", "text": "?"}]},
             {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Add."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Adding."}]},
             call, call | {"call_id": "c2"},
             {"type": "function_call_output", "call_id": "c1", "output": "3"},
             {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "3"}]},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Done."}], "encrypted_content": "x"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Both 3."}]},
             {"type": "message", "role": "assistant", "content": "And again."},
             {"role": "developer", "content": "Stay brief."}, {"role": "user", "content": "Thanks."}]
    calls = [{"id": c, "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}} for c in ("c1", "c2")]
    assert as_chat(items) == [
        {"role": "user", "content": "Sum?"},
        {"role": "assistant", "content": "<think>\nAdd.\n</think>\n\nAdding.", "tool_calls": calls},
        {"role": "tool", "content": "3", "tool_call_id": "c1"}, {"role": "tool", "content": "3", "tool_call_id": "c2"},
        {"role": "assistant", "content": "<think>\nDone.\n</think>\n\nBoth 3."},
        {"role": "assistant", "content": "And again."},
        {"role": "system", "content": "Stay brief."}, {"role": "user", "content": "Thanks."}]


def test_sampling_reasoning_and_tools_map_to_the_chat_fields():
    request = chat(max_output_tokens=7, temperature=0, top_p=0.5, reasoning={"effort": "minimal"}, tools=[ADD],
                   parallel_tool_calls=False)
    assert (request.reply_cap, request.temperature, request.top_p) == (7, 0, 0.5)
    assert request.thinking(default=True) is False and chat(reasoning={"effort": "low"}).thinking(default=False)
    assert chat().thinking(default=True) is True  # no effort: the server's default
    assert request.offered_tools == [{"type": "function", "function": {"name": "add", "description": "Adds.",
                                                                       "parameters": {"type": "object"}}}]
    assert request.stop_strings == ("</tool_call>",)
    assert chat(tools=[ADD], tool_choice="none").offered_tools is None


def test_forced_calls_and_json_formats_are_the_chat_endpoints_grammars():
    assert chat(tools=[ADD], tool_choice="required").tool_choice == "required"
    named = chat(tools=[ADD], tool_choice={"type": "function", "name": "add"})
    assert named.tool_choice.function.name == "add" and named.build_grammar() is not None
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    json_schema = chat(text={"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}})
    assert json_schema.response_format.json_schema.schema_ == schema and json_schema.build_grammar() is not None
    assert chat(text={"format": {"type": "json_object"}}).response_format.type == "json_object"
    assert chat(text={"format": {"type": "text"}, "verbosity": "low"}).build_grammar() is None


def test_other_tool_types_are_dropped_and_named():
    body = ResponsesRequest.model_validate({"model": "m", "input": "x", "tools": [
        ADD, {"type": "web_search"}, {"type": "local_shell"}, {"type": "web_search", "external_web_access": False}]})
    translated = translate(body)
    assert translated.dropped == ["web_search", "local_shell", "web_search"]
    assert [t["function"]["name"] for t in translated.chat.offered_tools] == ["add"]
    assert translate(body.model_copy(update={"tools": [{"type": "web_search"}], "tool_choice": "auto"})) \
        .chat.offered_tools is None


@pytest.mark.parametrize("fields, words", [
    ({"previous_response_id": "resp_1"}, "does not store responses"),
    ({"conversation": "conv_1"}, "does not store responses"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "needs a schema"),
    ({"text": {"format": {"type": "json_schema", "schema": {"const": "x" * 20_000}}}}, "const"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "name": "nope"}}, "not one of the tools"),
    ({"tools": [{"type": "web_search"}], "tool_choice": "required"}, "no function tool to call"),
    ({"tools": [ADD | {"parameters": "not a schema"}]}, "tools.0.parameters"),
    ({"input": []}, "holds no message"),
])
def test_what_we_cannot_serve_is_a_clear_400(fields, words):
    with pytest.raises(APIError) as caught:
        chat(**fields)
    assert caught.value.status == 400 and words in caught.value.message


@pytest.mark.parametrize("items", [
    [{"type": "input_image", "image_url": "x"}],
    [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
    [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}],
    [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "..."}],
])
def test_items_we_cannot_render_are_invalid(items):
    with pytest.raises(ValidationError):
        ResponsesRequest.model_validate({"model": "m", "input": items})
