"""Anthropic's Messages API translated at the edge, without a server: what the chat endpoint is asked."""

from __future__ import annotations

import pytest

from app.serve.anthropic_replies import matched_stop
from app.serve.anthropic_schemas import MessagesPrompt, MessagesRequest
from app.serve.anthropic_translate import chat_body
from app.serve.errors import APIError

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


def as_chat(**fields) -> list[dict]:
    return [m.as_dict() for m in chat_body(MessagesPrompt.model_validate({"model": "m", **fields})).messages]


def test_the_billing_header_block_is_dropped_and_the_rest_joined():
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37; cch=9f3a1;"},
              {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Answer in French."}]
    assert as_chat(system=system, messages=QUESTION)[0] == {"role": "system",
                                                            "content": "You are terse.\n\nAnswer in French."}
    assert as_chat(system=system[:1], messages=QUESTION) == [{"role": "user", "content": "What is 12 + 7?"}]


def test_claude_codes_request_a_system_message_within_the_messages_stays_where_it_stands():
    """As Claude Code 2.1 sends it: a system message after the first user turn (its list of agent types), and
    top-level fields that ask for nothing this server can give (context editing, effort, thinking not shown)."""
    body = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 9, "system": "You are terse.", "metadata": {"user_id": '{"session_id":"s"}'},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"}, "thinking": {"type": "adaptive", "display": "omitted"},
        "messages": [*QUESTION, {"role": "system", "content": "Agent types: claude."},
                     {"role": "assistant", "content": "19."},
                     {"role": "user", "content": [{"type": "text", "text": "Again."}]},
                     {"role": "system", "content": [{"type": "text", "text": "<total_tokens>9 tokens left</total_tokens>"}]}]})
    assert [m.as_dict() for m in chat_body(body).messages] == [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 12 + 7?"},
        {"role": "system", "content": "Agent types: claude."}, {"role": "assistant", "content": "19."},
        {"role": "user", "content": "Again."}, {"role": "system", "content": "<total_tokens>9 tokens left</total_tokens>"}]


def test_a_thinking_block_is_the_replys_reasoning():
    turn = [*QUESTION, {"role": "assistant", "content": [{"type": "thinking", "thinking": "2 + 7 = 9", "signature": ""},
                                                         {"type": "text", "text": "19."}]},
            {"role": "user", "content": "And 3 + 4?"}]
    reply = as_chat(messages=turn)[1]
    assert reply == {"role": "assistant", "content": "<think>\n2 + 7 = 9\n</think>\n\n19."}


def test_sampling_and_thinking_map_to_the_chat_fields():
    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 7, "messages": QUESTION, "temperature": 0,
                                           "top_k": 5, "stop_sequences": ["\n\n"], "thinking": {"type": "disabled"}})
    chat = chat_body(body)
    assert (chat.reply_cap, chat.temperature, chat.top_k, chat.stop_strings) == (7, 0, 5, ("\n\n",))
    assert chat.thinking(default=True) is False
    assert chat_body(body.model_copy(update={"thinking": None})).thinking(default=True) is True


TOOL = {"name": "add", "description": "Adds.", "input_schema": {"type": "object"}}
CALLED = [*QUESTION, {"role": "assistant", "content": [
    {"type": "thinking", "thinking": "Add them.", "signature": ""}, {"type": "text", "text": "Adding."},
    {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 12, "b": 7}},
    {"type": "tool_use", "id": "toolu_2", "name": "sub", "input": {}}]}]


def test_tools_and_tool_turns_become_the_chat_endpoints():
    results = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "19"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
         "content": [{"type": "text", "text": "no such"}, {"type": "text", "text": "tool"}]},
        {"type": "text", "text": "Go on."}]}
    body = MessagesPrompt.model_validate({"model": "m", "tools": [TOOL], "messages": [*CALLED, results]})
    chat = chat_body(body)
    assert chat.offered_tools == [{"type": "function", "function": {"name": "add", "description": "Adds.",
                                                                    "parameters": {"type": "object"}}}]
    assert [m.as_dict() for m in chat.messages[1:]] == [
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\nAdding.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 12, "b": 7}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "sub", "arguments": "{}"}}]},
        {"role": "tool", "content": "19", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: no such\n\ntool", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "Go on."}]


def test_tool_choice_maps_onto_the_chat_endpoints():
    def chat(choice, tools=(TOOL,)):
        return chat_body(MessagesPrompt.model_validate({"model": "m", "messages": QUESTION, "tools": list(tools),
                                                        "tool_choice": choice}))

    assert chat({"type": "none"}).offered_tools is None
    one = chat({"type": "auto", "disable_parallel_tool_use": True})
    assert one.offered_tools and one.stop_strings == ("</tool_call>",) and one.build_grammar() is None
    forced = chat({"type": "any"})
    assert forced.tool_choice == "required" and forced.build_grammar() is not None
    named = chat({"type": "tool", "name": "add"})
    assert named.tool_choice.function.name == "add" and named.build_grammar() is not None
    for wrong, words in (({"type": "tool", "name": "nope"}, "not one of the tools"),
                         ({"type": "any"}, "needs tools")):
        with pytest.raises(APIError) as caught:
            chat(wrong, tools=() if words == "needs tools" else (TOOL,))
        assert caught.value.status == 400 and words in caught.value.message, caught.value.message
    with pytest.raises(ValueError, match="needs the tool's name"):
        chat({"type": "tool"})


def test_structured_output_is_the_chat_endpoints_json_schema():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 9, "messages": QUESTION,
                                           "output_config": {"effort": "low",
                                                             "format": {"type": "json_schema", "schema": schema}}})
    chat = chat_body(body)
    assert chat.response_format.json_schema.schema_ == schema and chat.build_grammar() is not None
    with pytest.raises(APIError) as caught:
        chat_body(body.model_copy(update={"output_config": body.output_config.model_copy(update={
            "format": body.output_config.format.model_copy(update={"schema_": {"const": "x" * 20_000}})})}))
    assert caught.value.status == 400 and "const" in caught.value.message


@pytest.mark.parametrize("fields, words", [
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "server tool"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "add", "input": {}}]}]},
     "assistant messages only"),
    ({"messages": [*QUESTION, {"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
     "text blocks only"),
    ({"messages": [*CALLED, {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "19"}]}, *QUESTION]}, "user messages only"),
])
def test_tool_blocks_out_of_place_are_400s(fields, words):
    with pytest.raises((APIError, ValueError)) as caught:
        chat_body(MessagesPrompt.model_validate({"model": "m", "messages": QUESTION} | fields))
    assert words in str(getattr(caught.value, "message", caught.value))


def test_the_stop_sequence_is_the_one_where_the_kept_text_ends():
    assert matched_stop("a 7 = 9", "a ", ("=", "7 =")) == "7 ="
    assert matched_stop("x END y STOP", "x ", ("STOP", "END")) == "END"
