"""The one reply parser: reasoning, text and tool calls, the same however the text is cut into deltas.

Replies are shaped as Qwen3 writes them (its template's own ``<tool_call>`` lines,
as in Qwen's function-calling guide) and as Qwen3-Coder writes its XML calls.
The reference for a reply cut at random is the same reply fed whole.
"""

from __future__ import annotations

import json
import logging

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.reply_parser import ReplyParser

WEATHER = {"type": "function", "function": {
    "name": "get_current_temperature", "description": "Get current temperature at a location.",
    "parameters": {"type": "object", "required": ["location"], "properties": {
        "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}, "precise": {"type": "boolean"}, "where": {"type": "object"}}}}}
TOOLS = [WEATHER]

# Qwen3 with thinking on, two calls in parallel (the shape of Qwen's function-calling guide)
PARALLEL = ('<think>\nThe user wants the temperature now and tomorrow. I should call the tool twice.\n</think>\n\n'
            '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
            '"San Francisco, CA, USA", "unit": "celsius", "where": {"lat": 37.7, "tags": ["a}", "b\\"{"]}}}\n'
            '</tool_call>')
# text first, then a call (thinking off: the template's empty block is in the prompt, not the reply)
TEXT_THEN_CALL = ('Let me check the weather for you.\n\n<tool_call>\n{"name": "get_current_temperature", '
                  '"arguments": {"location": "Paris"}}\n</tool_call>')
# a call begun inside a <think> the model never closed
IN_THINK = ('<think>\nI need the temperature.\n<tool_call>\n{"name": "get_current_temperature", "arguments": '
            '{"location": "Oslo"}}\n</tool_call>')
# Qwen3-Coder's XML format, values typed from the schema
XML = ('<tool_call>\n<function=get_current_temperature>\n<parameter=location>\nSan Francisco, CA\n</parameter>\n'
       '<parameter=days>\n3\n</parameter>\n<parameter=precise>\ntrue\n</parameter>\n<parameter=unit>\n'
       'celsius\n</parameter>\n</function>\n</tool_call>')
BROKEN = 'Sure. <tool_call>\n{"name": "get_current_temperature", "arguments": {"location": }\n</tool_call> Done.'
CUT = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "Par'
PLAIN = '<think>\nJust chat.\n</think>\n\nHello! <b>Hi</b> 1 < 2 and <tool_call text.'
REPLIES = [PARALLEL, TEXT_THEN_CALL, IN_THINK, XML, BROKEN, CUT, PLAIN]


def parse(text: str, cuts: list[int] = (), tools=TOOLS) -> tuple[ReplyParser, list]:
    parser = ReplyParser(tools)
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    deltas = [parser.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])] + [parser.finish()]
    return parser, deltas


def result(parser: ReplyParser) -> tuple:
    return parser.reasoning, parser.content, [(c.name, c.arguments) for c in parser.calls]


def streamed_calls(deltas) -> dict[int, list]:
    """What a client that follows ``delta.tool_calls`` puts together: index -> [id, name, arguments]."""
    calls: dict[int, list] = {}
    for delta in deltas:
        for call in delta.calls:
            if call.id is not None:
                assert call.index not in calls and call.name, "a call's id and name come once, first"
                calls[call.index] = [call.id, call.name, ""]
            calls[call.index][2] += call.arguments
    return calls


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(REPLIES), st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_cut_into_deltas_gives_the_same_reply(reply, cuts):
    whole, _ = parse(reply)
    parser, deltas = parse(reply, cuts)
    assert result(parser) == result(whole)
    assert "".join(d.reasoning for d in deltas) == parser.reasoning
    assert "".join(d.content for d in deltas) == parser.content
    streamed = {i: call for i, call in streamed_calls(deltas).items() if i not in parser.broken}
    assert [(name, args) for _, name, args in streamed.values()] == [(c.name, c.arguments) for c in parser.calls]
    assert [i for i, _, _ in streamed.values()] == [c.id for c in parser.calls]


PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<", "<t", "</", "\n", " ", "a",
          '{"name": "f", "arguments": {}}', '{"name": "f", "arguments": {"a": "}']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14).map("".join),
       st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_any_text_at_any_cut_is_kept_whole(text, cuts):
    """Any mix of tags, partial tags and calls reads the same fed whole or cut anywhere."""
    whole, _ = parse(text)
    parser, _ = parse(text, cuts)
    assert result(parser) == result(whole)


def test_parallel_calls_in_a_thinking_reply():
    parser, deltas = parse(PARALLEL, list(range(len(PARALLEL))))  # one character per delta
    assert parser.reasoning.strip() == "The user wants the temperature now and tomorrow. I should call the tool twice."
    assert parser.content == ""
    assert [c.parsed_arguments() for c in parser.calls] == [
        {"location": "San Francisco, CA, USA"},
        {"location": "San Francisco, CA, USA", "unit": "celsius", "where": {"lat": 37.7, "tags": ["a}", 'b"{']}}]
    pieces = [c.arguments for d in deltas for c in d.calls if c.index == 0 and c.arguments]
    assert len(pieces) > 10, "the arguments stream as they are generated, not whole at the end"


def test_the_name_goes_out_before_the_arguments_are_written():
    parser = ReplyParser(TOOLS)
    first = parser.feed('<tool_call>\n{"name": "get_current_temperature", "arguments": {"loc')
    assert [(c.index, c.name, c.arguments) for c in first.calls] == [(0, "get_current_temperature", '{"loc')]


def test_text_before_a_call_is_content_and_the_layout_between_is_not():
    parser, _ = parse(TEXT_THEN_CALL)
    assert parser.content == "Let me check the weather for you."
    assert parser.calls[0].parsed_arguments() == {"location": "Paris"}


def test_a_call_begun_inside_an_unclosed_think_is_a_call():
    parser, _ = parse(IN_THINK)
    assert parser.reasoning == "\nI need the temperature.\n"
    assert [c.name for c in parser.calls] == ["get_current_temperature"] and parser.content == ""


def test_xml_calls_are_typed_from_the_schema():
    parser, deltas = parse(XML, list(range(0, len(XML), 3)))
    assert parser.calls[0].parsed_arguments() == {"location": "San Francisco, CA", "days": 3, "precise": True,
                                                  "unit": "celsius"}
    assert streamed_calls(deltas)[0][2] == parser.calls[0].arguments


def test_a_call_that_does_not_parse_is_text_and_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxchat.tools"):
        parser, _ = parse(BROKEN)
    assert parser.calls == []
    assert parser.content == BROKEN
    assert "cannot be read" in caplog.text


def test_a_call_cut_off_by_the_end_of_the_reply_is_text():
    parser, deltas = parse(CUT)
    assert parser.calls == [] and parser.content == CUT
    assert parser.broken == [0] and streamed_calls(deltas)[0][1] == "get_current_temperature"


def test_without_tools_a_call_is_text():
    parser, _ = parse(TEXT_THEN_CALL, tools=None)
    assert parser.calls == [] and parser.content == TEXT_THEN_CALL


def test_arguments_written_as_a_json_string_are_read():
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
    parser, deltas = parse(text, [5, 30, 41])
    assert json.loads(parser.calls[0].arguments) == {"x": 1}
    assert streamed_calls(deltas)[0][2] == parser.calls[0].arguments


def whole_split(text: str) -> tuple[str, str]:
    """The reference without tools, on the whole text: a leading think block is reasoning, the rest the answer
    (newlines right after ``</think>`` are layout)."""
    head = text.lstrip()
    if not head.startswith("<think>"):
        return "", text
    thought, closed, answer = head[len("<think>"):].partition("</think>")
    return thought, answer.lstrip("\n") if closed else ""


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14).map("".join),
       st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_without_tools_it_splits_reasoning_from_the_answer_as_the_whole_text_does(text, cuts):
    parser, _ = parse(text, cuts, tools=None)
    assert (parser.reasoning, parser.content) == whole_split(text) and parser.calls == []
