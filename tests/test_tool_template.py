"""Tools, calls and results through Qwen3's own chat template: what mlxchat renders is what the template writes.

The reference is Qwen3's real template (its tokenizer files, in assets/) run by
transformers' ``apply_chat_template`` on the conversation in the shape its model
card uses (arguments as objects); mlxchat gets the same conversation as an
OpenAI client sends it (arguments as JSON text, the reasoning as
``reasoning_content``). The calls the template writes read back through the
reply parser as the calls that went in.
"""

from __future__ import annotations

import copy
import json

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer
from transformers import AutoTokenizer

from assets import QWEN3_TOKENIZER_DIR
from mlxcore.chat_template import render_chat_text
from mlxcore.reply_parser import ReplyParser

TOOLS = [{"type": "function", "function": {
    "name": "get_current_temperature", "description": "Get current temperature at a location.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The location, as \"City, State, Country\"."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}]
ARGS = [{"location": "San Francisco, CA, USA"}, {"location": "San Francisco, CA, USA", "unit": "celsius"}]


def conversation(as_text: bool) -> list[dict]:
    """A tool round trip: the question, two parallel calls (with reasoning), two results, the answer, a new question."""
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": "get_current_temperature", "arguments": json.dumps(a) if as_text else a}}
             for i, a in enumerate(ARGS)]
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What's the temperature in San Francisco now? And in celsius?"},
            {"role": "assistant", "content": "", "reasoning_content": "I will call the tool twice.",
             "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_0", "content": '{"temperature": 59.0, "unit": "fahrenheit"}'},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 15.0, "unit": "celsius"}'},
            {"role": "assistant", "content": "It is 59 °F (15 °C) in San Francisco."},
            {"role": "user", "content": "Thanks. And in Oslo?"}]


@pytest.fixture(scope="module")
def tokenizers():
    return load_tokenizer(QWEN3_TOKENIZER_DIR), AutoTokenizer.from_pretrained(QWEN3_TOKENIZER_DIR)


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("upto", [3, 5, 7])  # after the calls, after the results, a later turn
def test_a_tool_conversation_renders_as_qwen3s_template_writes_it(tokenizers, thinking, upto):
    ours, reference = tokenizers
    want = reference.apply_chat_template(conversation(as_text=False)[:upto], tools=TOOLS, tokenize=False,
                                         add_generation_prompt=True, enable_thinking=thinking)
    given = copy.deepcopy(conversation(as_text=True)[:upto])
    assert render_chat_text(ours, given, enable_thinking=thinking, tools=TOOLS) == want
    assert given == conversation(as_text=True)[:upto], "the caller's messages are left as they were"
    assert "# Tools" in want and "<tool_response>" in want or upto == 3


def test_the_calls_the_template_writes_read_back_as_the_calls():
    reference = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER_DIR)
    messages = conversation(as_text=False)[:3]
    before = reference.apply_chat_template(messages[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    whole = reference.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    reply = whole[len(before):].removesuffix("<|im_end|>\n")  # the assistant turn as the model writes it
    parser = ReplyParser(TOOLS)
    parser.feed(reply)
    parser.finish()
    assert parser.reasoning.strip() == "I will call the tool twice." and parser.content == ""
    assert [(c.name, c.parsed_arguments()) for c in parser.calls] == [("get_current_temperature", a) for a in ARGS]
    assert [c.arguments for c in parser.calls] == [json.dumps(a) for a in ARGS], "as written, so the cache matches"


def test_without_tools_the_prompt_is_unchanged(tokenizers):
    ours, reference = tokenizers
    plain = [{"role": "user", "content": "Hi"}]
    assert render_chat_text(ours, plain, enable_thinking=True) == \
        reference.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
