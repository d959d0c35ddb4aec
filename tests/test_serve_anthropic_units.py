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


@pytest.mark.parametrize("fields", [
    {"tools": [{"name": "add", "input_schema": {"type": "object"}}]},
    {"tool_choice": {"type": "any"}},
    {"messages": [*QUESTION, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "add",
                                                                "input": {}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "19"}]}]},
])
def test_tools_are_refused_for_now(fields):
    with pytest.raises(APIError) as caught:
        chat_body(MessagesPrompt.model_validate({"model": "m", "messages": QUESTION} | fields))
    assert caught.value.status == 400 and "Tools are not supported yet" in caught.value.message


def test_the_stop_sequence_is_the_one_where_the_kept_text_ends():
    assert matched_stop("a 7 = 9", "a ", ("=", "7 =")) == "7 ="
    assert matched_stop("x END y STOP", "x ", ("STOP", "END")) == "END"
